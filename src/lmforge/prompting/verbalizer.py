"""Verbalizers: answers [z] -> labels, and scoring answers by their log-likelihood under a language model.

Answer-label mapping is step 3 of prompting (Liu et al. 2021, "Pre-train, Prompt, and Predict", section 3.3):
``Verbalizer({"positive": ["great", "good"], "negative": ["terrible", "bad"]})``. Each answer is scored by

    score(a) = sum_j log p(a_j | prompt, a_<j)            reduction="sum"  (total log-likelihood)
    score(a) = score_sum(a) / len(a)                        reduction="mean" (length-normalised)

and a label's score is ``logsumexp`` over its answers, i.e. log of the total probability of saying any of them.

How each architecture reads the prompt (see :class:`lmforge.prompting.template.Prompt`):

    arch             model input                         answer tokens scored                 shared work
    decoder          prefix                              continuation, left to right          prompt KV cache
    encoder-decoder  prefix (encoder)                    decoder output after the start id   encoder output
    encoder (MLM)    prefix + n x [MASK] + suffix        the n masks, in parallel (cloze)      one row per length

For a decoder, the prompt runs once with ``use_cache=True``; its cache is replicated over the C candidates
(``KVCache.reorder``) and all candidates' remaining tokens run as one right-padded (C, L-1) batch. Right padding
needs no mask: under causal attention a real token never sees the pads after it. Several decoder prompts are
scored together: left-padded, with positions counted over real tokens, their caches replicated to N x C rows.

Multi-token cloze answers are scored with one mask per token, all predicted at once (Schick & Schuetze 2021,
PET), so ``score`` is a sum of independent per-mask log-probabilities, not a chain-rule likelihood.

Example:
    >>> import lmforge
    >>> v = Verbalizer({"positive": ["great", "good"], "negative": ["terrible", "bad"]})
    >>> v.labels
    ['positive', 'negative']
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    >>> lps = score_continuations(model.eval(), [1, 2, 3], [[4], [5, 6]])  # log p per answer token
    >>> [tuple(lp.shape) for lp in lps]
    [(1,), (2,)]
    >>> # with text: v.score(model, tokenizer, [Template("{x} It was {z}.").split("Nice.")]) -> (1, 2) scores
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from lmforge.prompting.template import Prompt
from lmforge.errors import UserInputError


class Verbalizer:
    """Maps each label to one or more answer words; see the module docstring.

    Args:
        mapping: ``{label: answer or [answers]}``; label order is the column order of :meth:`score`.
    """

    def __init__(self, mapping: dict[str, str | Sequence[str]]):
        if not mapping:
            raise UserInputError("a verbalizer needs at least one label")
        self.mapping = {str(k): [v] if isinstance(v, str) else list(v) for k, v in mapping.items()}
        empty = [k for k, v in self.mapping.items() if not v or not all(isinstance(a, str) and a for a in v)]
        if empty:
            raise UserInputError(f"verbalizer labels {empty} need non-empty answer strings")

    @classmethod
    def from_json(cls, source: str | Path) -> "Verbalizer":
        """From a JSON object, given as text or as a file path."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            text = Path(source).read_text(encoding="utf-8")
        mapping = json.loads(text)
        if not isinstance(mapping, dict):
            raise UserInputError('a verbalizer is a JSON object such as {"positive": ["great"], "negative": ["bad"]}')
        return cls(mapping)

    @property
    def labels(self) -> list[str]:
        return list(self.mapping)

    def answer(self, label: str) -> str:
        """The answer written for ``label`` in demonstrations (its first word)."""
        return self.mapping[str(label)][0]

    def __repr__(self) -> str:
        return f"Verbalizer({self.mapping})"

    @torch.no_grad()
    def score(self, model, tokenizer, prompts: Sequence[Prompt], *, reduction: str = "sum",
              use_cache: bool = True, batch_size: int = 16) -> torch.Tensor:
        """Label scores (N, C): logsumexp over each label's answers of their (total or mean) log-likelihood.

        Decoder prompts are scored ``batch_size`` at a time (:func:`score_continuations_batch`); other
        architectures, and ``use_cache=False`` (the reference path), one prompt at a time.
        """
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        flat = [(i, a) for i, answers in enumerate(self.mapping.values()) for a in answers]
        owner = torch.tensor([i for i, _ in flat])
        rows = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            spaces = {p.space for p in chunk}
            if model.config.arch == "decoder" and use_cache and batch_size > 1 and len(spaces) == 1:
                answer_ids = [tokenizer.encode(chunk[0].space + a, add_special_tokens=False) for _, a in flat]
                token_lps = score_continuations_batch(model, [tokenizer.encode(p.prefix) for p in chunk], answer_ids)
            else:
                token_lps = [score_answers(model, tokenizer, p,
                                           [tokenizer.encode(p.space + a, add_special_tokens=False) for _, a in flat],
                                           use_cache=use_cache) for p in chunk]
            for token_lp in token_lps:
                s = torch.stack([lp.sum() / (len(lp) if reduction == "mean" else 1) for lp in token_lp])  # (A,)
                rows.append(torch.stack([torch.logsumexp(s[owner == c], 0) for c in range(len(self.mapping))]))
        return torch.stack(rows) if rows else torch.empty(0, len(self.mapping))


def score_answers(model, tokenizer, prompt: Prompt, answer_ids: Sequence[Sequence[int]], *,
                  use_cache: bool = True) -> list[torch.Tensor]:
    """Per-token log-probabilities of each answer in ``prompt``'s answer slot: a list of (L_i,) tensors.

    Dispatches on ``model.config.arch``; see the table in the module docstring.
    """
    if any(len(a) == 0 for a in answer_ids):
        raise ValueError("an answer tokenised to no tokens")
    arch = model.config.arch
    if arch == "encoder":
        return score_cloze(model, tokenizer, prompt, answer_ids)
    context = tokenizer.encode(prompt.prefix)
    if arch == "decoder":
        return score_continuations(model, context, answer_ids, use_cache=use_cache)
    return score_seq2seq(model, context, answer_ids, share_encoder=use_cache)


def _pad(seqs: Sequence[Sequence[int]], width: int, value: int = 0) -> torch.Tensor:
    return torch.tensor([list(s) + [value] * (width - len(s)) for s in seqs], dtype=torch.long)


def _gather(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (..., V), targets (...) -> log p(target) (...), in float32 for stable sums."""
    return F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def score_continuations(model, context: Sequence[int], answers: Sequence[Sequence[int]], *,
                        use_cache: bool = True) -> list[torch.Tensor]:
    """Decoder LM: log p(answer_i tokens | context) per token, as a list of (L_i,) tensors.

    With ``use_cache`` the context runs once and its KV cache serves every answer; without, each row is
    ``context + answer`` in full (the reference the cached path must equal).
    """
    if not context:
        raise ValueError("a decoder needs a non-empty context to score a continuation")
    device = next(model.parameters()).device
    longest = max(len(a) for a in answers)
    # Learned positions stop at max_seq_len: drop the context's oldest tokens, which matter least for the answer.
    context = list(context)[-max(1, model.config.max_seq_len - longest + 1):]
    P, C = len(context), len(answers)
    if not use_cache:
        ids = _pad([context + list(a[:-1]) for a in answers], P + longest - 1).to(device)  # (C, P+L-1)
        logits = model(ids).logits[:, P - 1:]  # (C, L, V): position P-1+j predicts answer token j
        targets = _pad(answers, longest).to(device)
        lp = _gather(logits, targets)  # (C, L)
        return [lp[i, : len(a)].cpu() for i, a in enumerate(answers)]
    out = model(torch.tensor([context], device=device), use_cache=True)
    first = F.log_softmax(out.logits[0, -1].float(), dim=-1)  # (V,) distribution of every answer's first token
    result = [first[a[0]].reshape(1) for a in answers]
    if longest > 1:
        cache = out.past_key_values
        cache.reorder(torch.zeros(C, dtype=torch.long, device=device))  # (1, ...) -> (C, ...), one copy per answer
        rest = _pad([a[:-1] for a in answers], longest - 1).to(device)  # (C, L-1); pads only follow real tokens
        logits = model(rest, past_key_values=cache, use_cache=True).logits  # (C, L-1, V)
        lp = _gather(logits, _pad([a[1:] for a in answers], longest - 1).to(device))  # (C, L-1)
        result = [torch.cat([r, lp[i, : len(a) - 1]]) for i, (r, a) in enumerate(zip(result, answers))]
    return [r.cpu() for r in result]


@torch.no_grad()
def score_continuations_batch(model, contexts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
                              ) -> list[list[torch.Tensor]]:
    """Decoder LM, several contexts at once: ``result[n][i]`` = per-token log p(answers[i] | contexts[n]) (L_i,).

    The N contexts run as one left-padded batch (positions count real tokens only, so learned positions match
    an unpadded run); the cache is then replicated to N x C rows and every (context, answer) continuation runs
    as one (N*C, L-1) batch, answers right-padded.
    """
    if any(len(c) == 0 for c in contexts):
        raise ValueError("a decoder needs a non-empty context to score a continuation")
    device = next(model.parameters()).device
    longest, N, C = max(len(a) for a in answers), len(contexts), len(answers)
    keep = max(1, model.config.max_seq_len - longest + 1)
    contexts = [list(c)[-keep:] for c in contexts]
    P = max(len(c) for c in contexts)
    ids = _pad([[0] * (P - len(c)) + c for c in contexts], P).to(device)  # (N, P), left-padded
    real = torch.tensor([[0] * (P - len(c)) + [1] * len(c) for c in contexts], device=device)  # (N, P)
    positions = (real.cumsum(-1) - 1).clamp_min(0)  # (N, P): 0.. over real tokens
    out = model(ids, attention_mask=real, position_ids=positions, use_cache=True)
    first = F.log_softmax(out.logits[:, -1].float(), dim=-1)  # (N, V)
    heads = first[:, [a[0] for a in answers]]  # (N, C)
    result = [[heads[n, i].reshape(1) for i in range(C)] for n in range(N)]
    if longest > 1:
        cache = out.past_key_values
        row = torch.arange(N, device=device).repeat_interleave(C)  # (N*C,): row n*C+i = context n, answer i
        cache.reorder(row)
        rest = _pad([a[:-1] for a in answers], longest - 1).to(device).repeat(N, 1)  # (N*C, L-1)
        keys = torch.cat([real[row], torch.ones_like(rest)], dim=1)  # (N*C, P+L-1): pads of the contexts hidden
        pos = positions[row, -1:] + 1 + torch.arange(longest - 1, device=device)  # (N*C, L-1)
        logits = model(rest, attention_mask=keys, position_ids=pos, past_key_values=cache, use_cache=True).logits
        targets = _pad([a[1:] for a in answers], longest - 1).to(device).repeat(N, 1)
        lp = _gather(logits, targets).view(N, C, longest - 1)
        result = [[torch.cat([result[n][i], lp[n, i, : len(a) - 1]]) for i, a in enumerate(answers)]
                  for n in range(N)]
    return [[t.cpu() for t in r] for r in result]


@torch.no_grad()
def score_seq2seq(model, source: Sequence[int], answers: Sequence[Sequence[int]], *,
                  share_encoder: bool = True) -> list[torch.Tensor]:
    """Encoder-decoder LM: log p(answer_i | source) per token; the decoder starts from the model's start id.

    With ``share_encoder`` the source is encoded once for all answers; otherwise each row encodes it again.
    """
    device = next(model.parameters()).device
    longest, C = max(len(a) for a in answers), len(answers)
    src = torch.tensor([list(source)[: model.config.max_seq_len]], device=device)  # (1, S)
    start = model._decoder_start_id()
    dec_in = _pad([[start] + list(a[:-1]) for a in answers], longest).to(device)  # (C, L)
    if share_encoder:
        memory = model.encode(src)[0]
        memory = memory.expand(C, *memory.shape[1:])  # (C, S, D); (C, S, N + 1, D) under transparent attention
        logits = model(decoder_input_ids=dec_in, encoder_hidden_states=memory).logits
    else:
        logits = model(src.expand(C, -1), decoder_input_ids=dec_in).logits  # (C, L, V)
    lp = _gather(logits, _pad(answers, longest).to(device))
    return [lp[i, : len(a)].cpu() for i, a in enumerate(answers)]


@torch.no_grad()
def score_cloze(model, tokenizer, prompt: Prompt, answers: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """MLM encoder: an answer of n tokens fills n ``[MASK]``s; its token j is scored at mask j.

    One input row per distinct answer length; all rows run as one padded batch.
    """
    mask_token = tokenizer.special_token("mask")
    if mask_token is None:
        raise UserInputError("cloze prompts need a tokenizer with a mask token ([MASK] / <mask>)")
    mask_id = tokenizer.token_to_id(mask_token)
    device = next(model.parameters()).device
    lengths = sorted({len(a) for a in answers})
    rows = []
    for n in lengths:
        ids = tokenizer.encode(prompt.prefix + prompt.space + " ".join([mask_token] * n) + prompt.suffix)
        if ids.count(mask_id) != n:
            raise UserInputError(f"the prompt {prompt.prefix!r}...{prompt.suffix!r} must not contain the mask token")
        rows.append(_fit_masks(ids, mask_id, model.config.max_seq_len))
    width = max(len(r) for r in rows)
    ids = _pad(rows, width, tokenizer.pad_id).to(device)
    attention = _pad([[1] * len(r) for r in rows], width).to(device)
    logits = model(ids, attention_mask=attention).logits  # (R, T, V)
    result = []
    for a in answers:
        r = lengths.index(len(a))
        positions = (ids[r] == mask_id).nonzero().squeeze(-1)  # (n,) mask positions, left to right
        result.append(_gather(logits[r, positions], torch.tensor(list(a), device=device)).cpu())
    return result


def _fit_masks(ids: list[int], mask_id: int, limit: int) -> list[int]:
    """Cut an over-long cloze input from the left (after its first token, e.g. [CLS]) but never a mask."""
    extra = len(ids) - limit
    if extra <= 0:
        return ids
    first_mask = ids.index(mask_id)
    if extra > first_mask - 1:
        raise UserInputError(f"cloze prompt of {len(ids)} tokens does not fit max_seq_len={limit} around its masks")
    return ids[:1] + ids[1 + extra:]
