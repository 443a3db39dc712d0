"""Prefix tuning: trainable key/value vectors prepended at every attention layer (Li & Liang 2021,
"Prefix-Tuning: Optimizing Continuous Prompts for Generation").

Each self-attention layer attends over P extra positions whose keys and values are free parameters:

    head_i = Attention(x W_q,  [P_k ; x W_k],  [P_v ; x W_v])        P_k, P_v: (P, d_kv) per layer

Training the prefix directly is unstable, so Li & Liang train it through a reparameterisation
``P = MLP(E)`` (E: (P, D), MLP: D -> hidden -> tanh -> L * 2 * d_kv); :meth:`PrefixKV.fold` computes it
once and drops the MLP, leaving only the (L, 2, H_kv, P, hd) prefix for inference.

How the prefix reaches attention without touching the model: a forward pre-hook on each stack (encoder,
decoder) pre-fills the stack's :class:`~lmforge.nn.kv_cache.KVCache` with the prefix, which attention then
reads like cached positions. As in HF peft, positions of the real tokens start after the prefix, so
cached generation continues naturally: the prefix is written once, when the cache is empty, and later
steps only append. An encoder-decoder model gets a prefix in its encoder and in its decoder's
self-attention (Li & Liang's BART setup).

Mixed-adapter batches: rows may use different prefixes (or none). Shorter prefixes are left-padded to
the longest and the padding is masked out; positions are shifted per row, so each row computes exactly
what it would compute alone.

Example:
    >>> import torch, lmforge
    >>> from lmforge.nn.kv_cache import KVCache
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=2, dropout=0.0).eval(),
    ...                    PeftConfig(method="prefix", num_virtual_tokens=5, prefix_hidden=32))
    >>> ids = torch.randint(0, 8192, (1, 6))
    >>> full = model(ids).logits
    >>> cache = KVCache()
    >>> steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(6)]
    >>> cache.seq_len(), bool(torch.allclose(torch.cat(steps, 1), full, atol=1e-5))
    (11, True)
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.kv_cache import KVCache
from lmforge.peft.method import PeftMethod

PREFIX_OPTIONS = ("num_virtual_tokens", "prefix_projection", "prefix_hidden")  # MAM's prefix takes these too


class PrefixKV(nn.Module):
    """Key/value prefixes for every layer of one stack.

    ``forward()`` returns (L, 2, H_kv, P, hd): index [l, 0] is layer l's keys, [l, 1] its values.

    Args:
        n_layers, n_kv_heads, head_dim: the stack's attention shape.
        d_model: width of the reparameterisation's input embedding E.
        n_tokens: P, the prefix length.
        projection: train through ``MLP(E)`` (Li & Liang); False trains the prefix directly.
        hidden: the MLP's hidden width.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, d_model: int, n_tokens: int,
                 projection: bool = True, hidden: int = 512, device=None, dtype=None):
        super().__init__()
        self.shape = (n_layers, 2, n_kv_heads, n_tokens, head_dim)
        if projection:
            self.embedding = nn.Parameter(torch.randn(n_tokens, d_model, device=device, dtype=dtype))
            self.mlp = nn.Sequential(
                nn.Linear(d_model, hidden, device=device, dtype=dtype), nn.Tanh(),
                nn.Linear(hidden, n_layers * 2 * n_kv_heads * head_dim, device=device, dtype=dtype),
            )
            self.kv = None
        else:
            self.kv = nn.Parameter(torch.randn(self.shape, device=device, dtype=dtype))

    @property
    def n_tokens(self) -> int:
        return self.shape[3]

    def forward(self) -> torch.Tensor:
        if self.kv is not None:
            return self.kv
        L, _, H, P, hd = self.shape
        return self.mlp(self.embedding).view(P, L, 2, H, hd).permute(1, 2, 3, 0, 4)  # (L, 2, H, P, hd)

    @torch.no_grad()
    def fold(self) -> None:
        """Replace the reparameterisation by the prefix it computes (bit-identical outputs)."""
        if self.kv is None:
            kv = self().detach().clone(memory_format=torch.contiguous_format)
            del self.embedding, self.mlp
            self.kv = nn.Parameter(kv)


class Prefix(nn.Module):
    """One prefix adapter: a :class:`PrefixKV` per stack (``encoder`` and/or ``decoder``)."""

    def __init__(self, stacks: dict[str, PrefixKV]):
        super().__init__()
        self.stacks = nn.ModuleDict(stacks)

    def fold(self) -> None:
        for kv in self.stacks.values():
            kv.fold()


def build_prefix(base: nn.Module, cfg) -> Prefix:
    """A :class:`Prefix` shaped for every stack of lmforge Transformer ``base``, as PeftConfig ``cfg`` says."""
    c = base.config
    ref = base.embed_tokens.weight
    stacks = {
        name: PrefixKV(stack.n_layers, c.kv_heads, c.dim_per_head, c.d_model, cfg.num_virtual_tokens,
                       cfg.prefix_projection, cfg.prefix_hidden, device=ref.device, dtype=ref.dtype)
        for name in ("encoder", "decoder") if (stack := getattr(base, name)) is not None
    }
    return Prefix(stacks)


def attach(model, name: str, cfg, **_) -> None:
    """Give adapter ``name`` a prefix in every stack, and hook the stacks (once) to pre-fill their caches."""
    model.prefixes[name] = build_prefix(model.base_model, cfg)
    install_hooks(model)


# ---------------------------------------------------------------------------------------- the stack hook
@dataclass
class _Record:
    """What a cache was pre-filled with: the rows' adapters, their prefix lengths (B,), the padded width."""

    names: tuple
    lengths: torch.Tensor
    width: int

    @property
    def uniform(self) -> bool:
        return len(set(self.names)) == 1


class PrefixHook:
    """Forward pre-hook of a TransformerStack: pre-fill its KV cache with the rows' prefixes, then extend
    the padding mask over the prefix and shift the positions past it.

    Rewrites the stack call ``(tokens (B, T, E), attention_mask, token_type_ids, position_ids, memory,
    memory_mask, cache, ...)``; a call in which no row uses a prefix passes through untouched.
    """

    def __init__(self, peft_model, stack_name: str, stack: nn.Module):
        # A strong reference (a cycle the garbage collector handles), so copy.deepcopy of the PeftModel gives
        # hooks that serve the copy.
        self.model = peft_model
        self.stack_name = stack_name
        self.signature = inspect.signature(stack.forward)
        self.caches: weakref.WeakKeyDictionary[KVCache, _Record] = weakref.WeakKeyDictionary()

    def _prefixes(self, names: list) -> dict[str, torch.Tensor]:
        pm = self.model
        out = {}
        for n in set(names):
            if n is not None and n in pm.prefixes and self.stack_name in pm.prefixes[n].stacks:
                out[n] = pm.prefixes[n].stacks[self.stack_name]()  # (L, 2, H, P, hd)
        return out

    def __call__(self, module, args, kwargs):
        pm = self.model
        if not len(pm.prefixes):
            return None
        a = self.signature.bind(*args, **kwargs).arguments
        tokens = a["tokens"]
        B, T = tokens.shape[:2]
        names = pm.state.row_names(B)
        cache = a.get("cache")
        if cache is not None and cache.seq_len() > 0:  # a later decoding step: the prefix is already there
            record = self.caches.get(cache)
            if record is None:
                if not self._prefixes(names):
                    return None
                raise ValueError("prefix tuning: this KVCache already holds positions but was not started with the "
                                 "prefix; start generation from an empty cache with the adapter active")
            if record.uniform and set(names) == set(record.names):
                if len(names) != len(record.names):  # rows repeated or dropped (beam search): same prefix
                    record = _Record(tuple(names), record.lengths.new_full((B,), record.width), record.width)
                    self.caches[cache] = record
            elif record.names != tuple(names):
                raise ValueError(f"prefix tuning: the cache was started with adapters {list(record.names)}, "
                                 f"but this step uses {names}; keep the rows' adapters fixed during generation "
                                 "(a mixed-adapter batch cannot be reordered, e.g. by beam search)")
        else:
            kv = self._prefixes(names)
            if not kv:
                return None
            cache = KVCache() if cache is None else cache
            record = self._prefill(cache, names, kv, tokens.device)
            self.caches[cache] = record
            a["cache"] = cache
        self._shift(a, record, B, T, cache.seq_len(), tokens.device)
        return (), a

    @staticmethod
    def _prefill(cache: KVCache, names: list, kv: dict[str, torch.Tensor], device) -> _Record:
        width = max(p.shape[3] for p in kv.values())
        lengths = torch.tensor([kv[n].shape[3] if n in kv else 0 for n in names], device=device)
        if len(set(names)) == 1:
            rows = kv[names[0]].unsqueeze(0).expand(len(names), *kv[names[0]].shape)  # (B, L, 2, H, P, hd)
        else:
            some = next(iter(kv.values()))
            pad = {n: F.pad(p, (0, 0, width - p.shape[3], 0)) for n, p in kv.items()}  # left-pad P to width
            empty = some.new_zeros(*some.shape[:3], width, some.shape[4])
            rows = torch.stack([pad.get(n, empty) for n in names])  # (B, L, 2, H, width, hd)
        for layer in range(rows.shape[1]):
            cache.update(layer, rows[:, layer, 0], rows[:, layer, 1])
        return _Record(tuple(names), lengths, width)

    @staticmethod
    def _shift(a: dict, record: _Record, B: int, T: int, past: int, device) -> None:
        """Positions of real tokens start after each row's prefix; padded prefix slots are masked out."""
        width, lengths = record.width, record.lengths
        real_past = past - width  # real tokens already in the cache
        S_real = real_past + T
        pos = a.get("position_ids")
        if pos is not None:
            a["position_ids"] = pos + lengths[:, None]
        elif not record.uniform:
            a["position_ids"] = lengths[:, None] + real_past + torch.arange(T, device=device)[None]
        valid = torch.arange(width, device=device)[None] >= (width - lengths)[:, None]  # (B, width)
        mask = a.get("attention_mask")
        if mask is None:
            if not record.uniform:
                a["attention_mask"] = torch.cat([valid, valid.new_ones(B, S_real)], dim=1)
        elif mask.dim() == 2:
            real = mask.bool()
            if real.shape[1] < S_real:  # given for the newest positions only: earlier ones were real
                real = torch.cat([real.new_ones(B, S_real - real.shape[1]), real], dim=1)
            if real.shape[1] != S_real:
                raise ValueError(f"attention_mask covers {mask.shape[1]} positions, but there are {S_real} "
                                 f"(the {width} prefix positions are added by prefix tuning)")
            a["attention_mask"] = torch.cat([valid.expand(B, width), real], dim=1)
        else:
            if mask.shape[-1] != S_real:
                raise ValueError(f"explicit attention_mask has {mask.shape[-1]} key positions, expected {S_real}")
            a["attention_mask"] = torch.cat([valid[:, None].expand(B, T, width), mask.bool()], dim=-1)


def install_hooks(model) -> None:
    """Register :class:`PrefixHook` on each stack of ``model.base_model`` (once per PeftModel)."""
    if model.prefix_hooks:
        return
    base = model.base_model
    for name in ("encoder", "decoder"):
        stack = getattr(base, name)
        if stack is not None:
            model.prefix_hooks.append(stack.register_forward_pre_hook(PrefixHook(model, name, stack), with_kwargs=True))


METHOD = PeftMethod("prefix", attach, options=PREFIX_OPTIONS)
