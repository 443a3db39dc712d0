"""Bidirectional language modelling (ELMo's biLM): a forward LM and a backward LM over the same tokens.

Peters et al. (2018), "Deep contextualized word representations", §3.1, maximise the sum of both directions'
log likelihoods::

    sum_t  log p(x_t | x_1 .. x_{t-1})  +  log p(x_t | x_{t+1} .. x_T)

Both LMs run over the *same* input (no shifting, no masking), so the targets are aligned per direction at the
position that makes the prediction: ``labels[:, 0, t] = x_{t+1}`` (the forward LM at t), ``labels[:, 1, t] =
x_{t-1}`` (the backward LM at t), and -100 where there is no neighbour. The model
(:class:`lmforge.models.bilstm_lm.BiLM`) returns its loss and logits in that order, so the Trainer runs this
objective unchanged: every real token is a target of each direction except at the ends.

Framing. ELMo wraps every sentence in ``<S> ... </S>``. Given start/end ids (the tokenizer's ``[CLS]``/``[SEP]``,
or ``<s>``/``</s>``, filled in by name by ``lmforge pretrain``), each segment is framed the same way the
tokenizer frames a text at encoding time, so a sentence embedded later starts and ends as in training. Without
them the segment is used as is.

The objective draws no random numbers; ``state_dict()`` is empty, for the common resume interface.

Example::

    >>> bilm = BiLMObjective(pad_token_id=0, cls_token_id=1, sep_token_id=2)
    >>> batch = bilm([[5, 6], [7]])
    >>> batch["input_ids"].tolist()
    [[1, 5, 6, 2], [1, 7, 2, 0]]
    >>> batch["labels"][1].tolist()          # forward targets, backward targets
    [[7, 2, -100, -100], [-100, 1, 7, -100]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.models.bilstm_lm import bilm_labels
from lmforge.objectives.base import as_ids, pad


class BiLMObjective:
    """The ``bilm`` collator: token sequences -> ``input_ids, attention_mask`` (B, T) and ``labels`` (B, 2, T).

    Args:
        pad_token_id: padding id (right padding; padded positions carry no target).
        cls_token_id, sep_token_id: frame each sequence as ``[CLS] x [SEP]`` (BERT-family tokenizers).
        bos_token_id, eos_token_id: the fallback frame ``<s> x </s>`` when there is no [CLS]/[SEP].
            Either end may be None (T5: ``x </s>``); all None: no framing.
    """

    def __init__(self, *, pad_token_id: int, cls_token_id: int | None = None, sep_token_id: int | None = None,
                 bos_token_id: int | None = None, eos_token_id: int | None = None):
        self.pad_token_id = pad_token_id
        self.start_id = cls_token_id if cls_token_id is not None else bos_token_id
        self.end_id = sep_token_id if sep_token_id is not None else eos_token_id

    def _frame(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [torch.tensor([i]) for i in (self.start_id,) if i is not None] + [ids]
        parts += [torch.tensor([i]) for i in (self.end_id,) if i is not None]
        return torch.cat(parts) if len(parts) > 1 else ids

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        seqs = [self._frame(as_ids(x)) for x in examples]
        if any(len(s) < 2 for s in seqs):
            raise ValueError("the biLM objective needs sequences of at least 2 tokens (one context, one target)")
        ids, real = pad(seqs, self.pad_token_id)  # (B, T) each
        mask = real.long()
        return {"input_ids": ids, "attention_mask": mask, "labels": bilm_labels(ids, mask)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"BiLMObjective is stateless; got unexpected state keys {sorted(state)}")
