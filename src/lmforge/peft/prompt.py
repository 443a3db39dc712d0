"""Prompt tuning: a trainable soft prompt prepended to the input embeddings (Lester et al. 2021, "The Power
of Scale for Parameter-Efficient Prompt Tuning").

    inputs_embeds = [ prompt (P, E) ; embed(input_ids) (T, E) ]          only the prompt is trained

The prompt goes before the model's input: the decoder input of a decoder-only model, the encoder input of
an encoder or encoder-decoder model. Lester et al. found initialising it from vocabulary embeddings (or
from the embeddings of a task description) much better than random, so ``prompt_init`` offers ``vocab``
(rows of random tokens), ``text`` (the tokens of ``prompt_init_text``, repeated to length P) and ``random``.

:func:`prepare` rewrites a forward call (it is used by PeftModel.forward): it prepends the prompt, extends
the padding mask, segment ids and labels (-100 over the prompt) and shifts explicit positions; outputs for
the prompt positions are removed again by :func:`strip`, so logits line up with ``input_ids``. The encoder
states of an encoder-decoder model keep the prompt, because the decoder attends to it. In cached decoding
the prompt enters the cache at the first step, and later steps only append, as with any prefix.

Example:
    >>> import torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> base = lmforge.build_model("gpt-tiny", n_layers=1)
    >>> model = apply_peft(base, PeftConfig(method="prompt", num_virtual_tokens=4))
    >>> model(torch.randint(0, 8192, (2, 7))).logits.shape     # prompt positions are not returned
    torch.Size([2, 7, 8192])
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.peft.method import PeftMethod


class SoftPrompt(nn.Module):
    """P trainable input vectors: ``embedding`` (P, E)."""

    def __init__(self, embedding: torch.Tensor):
        super().__init__()
        self.embedding = nn.Parameter(embedding.detach().clone())

    @property
    def n_tokens(self) -> int:
        return self.embedding.shape[0]


def init_prompt(table: torch.Tensor, cfg, tokenizer=None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The initial (P, E) prompt from the embedding ``table`` (V, E), following ``cfg.prompt_init``."""
    P = cfg.num_virtual_tokens
    if cfg.prompt_init == "random":
        return torch.randn(P, table.shape[1], generator=generator, device=table.device, dtype=table.dtype) * table.std()
    if cfg.prompt_init == "vocab":
        ids = torch.randint(0, table.shape[0], (P,), generator=generator, device=table.device)
    else:
        if tokenizer is None:
            raise ConfigError("PeftConfig.prompt_init='text' needs a tokenizer: apply_peft(..., tokenizer=tok)")
        encoded = tokenizer.encode(cfg.prompt_init_text, add_special_tokens=False)  # lmforge, HF or tokenizers
        ids = list(getattr(encoded, "ids", encoded))
        if not ids:
            raise ConfigError(f"PeftConfig.prompt_init_text={cfg.prompt_init_text!r} encodes to no tokens")
        if max(ids) >= table.shape[0]:
            raise ConfigError(f"prompt_init_text token id {max(ids)} is outside the model's vocabulary "
                              f"({table.shape[0]})")
        ids = torch.tensor((ids * (P // len(ids) + 1))[:P], device=table.device)  # repeat the text to length P
    return table[ids].detach().clone()


def attach(model, name: str, cfg, tokenizer=None, **_) -> None:
    """Give adapter ``name`` a soft prompt, initialised as PeftConfig ``cfg`` says."""
    base = model.base_model
    model.prompts[name] = SoftPrompt(init_prompt(base.embed_tokens.weight, cfg, tokenizer))


# ---------------------------------------------------------------------------------------- forward rewriting
def prepare(base: nn.Module, a: dict, prompt: torch.Tensor, started: weakref.WeakKeyDictionary) -> int:
    """Rewrite the bound arguments ``a`` of ``Transformer.forward`` to prepend ``prompt`` (P, E).

    Returns the number of positions prepended to the decoder-side outputs (P for decoder-only and
    encoder models, 0 for encoder-decoder models, whose prompt lives in the encoder input, and for later
    decoding steps). ``started`` maps each KV cache that received the prompt to P (see :func:`remember`).
    """
    cfg = base.config
    P = prompt.shape[0]
    if cfg.arch == "encoder-decoder":
        if a.get("encoder_hidden_states") is not None:
            # States computed by PeftModel.encode already hold the prompt; widen a mask given for the text only.
            mask = a.get("attention_mask")
            if mask is not None and mask.dim() == 2 and mask.shape[1] + P == a["encoder_hidden_states"].shape[1]:
                a["attention_mask"] = _extend(mask, P, 1)
            return 0
        _prepend(base, a, prompt, labels=False)
        return 0
    cache = a.get("past_key_values")
    if cache is not None and cache.seq_len() > 0:
        # A later decoding step: the prompt is already cached. Explicit positions count the caller's tokens,
        # so they move past the prompt, as they did when it was prepended.
        if cache not in started:
            raise ValueError("prompt tuning: this KVCache already holds positions but was not started with the "
                             "prompt; start generation from an empty cache with the adapter active")
        if a.get("position_ids") is not None:
            a["position_ids"] = a["position_ids"] + started[cache]
        return 0
    _prepend(base, a, prompt, labels=True)
    return P


def remember(out, P: int, started: weakref.WeakKeyDictionary) -> None:
    """Record that the cache returned in ``out`` starts with a P-token prompt."""
    if P and out.past_key_values is not None:
        started[out.past_key_values] = P


def prepare_encode(base: nn.Module, a: dict, prompt: torch.Tensor) -> None:
    """Rewrite the bound arguments of ``Transformer.encode`` to prepend ``prompt``."""
    _prepend(base, a, prompt, labels=False)


def _prepend(base: nn.Module, a: dict, prompt: torch.Tensor, labels: bool) -> None:
    ids, embeds = a.get("input_ids"), a.get("inputs_embeds")
    if embeds is None:
        if ids is None:
            raise ValueError("prompt tuning needs input_ids or inputs_embeds")
        embeds = base.embed_tokens(ids)
    B, P = embeds.shape[0], prompt.shape[0]
    a.pop("input_ids", None)
    a["inputs_embeds"] = torch.cat([prompt.to(embeds.dtype).unsqueeze(0).expand(B, -1, -1), embeds], dim=1)
    mask = a.get("attention_mask")
    if mask is not None:
        if mask.dim() != 2:
            raise ValueError("prompt tuning takes a (B, T) padding mask, not an explicit (B, T, S) attention mask")
        a["attention_mask"] = _extend(mask, P, 1)
    if a.get("token_type_ids") is not None:
        a["token_type_ids"] = _extend(a["token_type_ids"], P, 0)
    if a.get("position_ids") is not None:
        pos = a["position_ids"]
        pos = pos.expand(B, -1) if pos.dim() == 2 else pos.expand(B, pos.shape[-1])
        a["position_ids"] = torch.cat([torch.arange(P, device=pos.device).expand(B, P), pos + P], dim=1)
    if labels and a.get("labels") is not None:
        a["labels"] = _extend(a["labels"], P, -100)
        if a.get("label_weights") is not None:
            a["label_weights"] = _extend(a["label_weights"], P, 0.0)


def _extend(t: torch.Tensor, P: int, value) -> torch.Tensor:
    """Prepend P columns of ``value`` to a (B, T) tensor."""
    return torch.cat([t.new_full((t.shape[0], P), value), t], dim=1)


def strip(out, P: int):
    """Drop the first P (prompt) positions of the per-token outputs of a ModelOutput."""
    if not P:
        return out
    if out.logits is not None and out.loss is None:
        # the logits of the last n positions only (logits_to_keep=n): drop just the prompt positions among them
        T = out.logits.shape[1] if out.last_hidden_state is None else out.last_hidden_state.shape[1]
        out.logits = out.logits[:, max(0, out.logits.shape[1] - (T - P)):]
    if out.last_hidden_state is not None:
        out.last_hidden_state = out.last_hidden_state[:, P:]
    if out.hidden_states is not None:
        out.hidden_states = [h[:, P:] for h in out.hidden_states]
    return out


METHOD = PeftMethod("prompt", attach, options=("num_virtual_tokens", "prompt_init", "prompt_init_text"))
