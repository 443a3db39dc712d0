"""The price tag of running a model: FLOPs, device-seconds, energy, CO2e and dollars of an inference command.

Schwartz et al. (2019, "Green AI") ask for the cost of developing, training *and running* a model. Training's
tag (:mod:`lmforge.training.price_tag`) charges 6N FLOPs per token plus attention; a forward alone is a third
of that (PaLM appendix B): 2N per token, where N counts the weights a token multiplies by (the vocabulary
projection included), plus 4·d_attn per key each query attends to, in every layer:

    forward FLOPs = B · T · (2N + L · 4 · d_attn · K)

for a batch of B rows, T new tokens per row and K keys per query (a sliding window caps K). A forward over
a whole sequence has K = T (each query is charged every key, as in training's count and as SDPA computes the
score matrix); a KV-cached decoding step has T = 1 and K = the tokens in the cache, so it costs one token's
weights, not the prompt's again. ``logits_to_keep = n`` (decoding keeps the last position's logits only)
charges the vocabulary projection for n positions. An encoder-decoder charges its encoder once per source
(not when ``encoder_hidden_states`` is passed back in) and its decoder per target token, with S more keys
(cross-attention). These counts reuse :meth:`~lmforge.models.transformer.Transformer.train_flops` (so MoE
routing, shared layers, tied embeddings and Linformer count as in training): it is a quadratic in the target
length, and its coefficients are the per-token and per-key costs.

What is counted: every forward of every :class:`~lmforge.models.transformer.Transformer` built while an
:class:`InferenceTag` is open (or given to :meth:`InferenceTag.watch`), and every stack of one run on its own
(``Transformer.encode``), whatever drives it (generation, scoring, embedding, classification, beams, padding
included: the device computed it), through hooks on those modules. A forward traced by
``torch.compile`` runs no hook; it is not counted and ``flops_method`` says so. A model that is no
Transformer (a baseline, the biLSTM, an HF wrapper) has no formula: its FLOPs are 0 and ``flops_method`` says so.

Device-seconds, energy, CO2e and dollars are those of training's tag (a :class:`PriceTag` over the command's
span: on a CPU its process CPU seconds over the threads, at most the wall time; on a GPU its wall seconds; the
same power, grid and price defaults), so ``lmforge cost`` sums inference and training tags alike.

Example:
    >>> import lmforge, torch
    >>> m = lmforge.build_model("gpt-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=10).eval()
    >>> forward_flops(m, batch=1, new_tokens=8) == m.train_flops(8) // 3
    True
    >>> with InferenceTag(PriceSettings.resolve("cpu"), command="demo").watch(m) as tag, torch.no_grad():
    ...     _ = m(torch.zeros(2, 8, dtype=torch.long))
    >>> tag.flops == 2 * m.train_flops(8) // 3, tag.tokens, tag.summary()["kind"]
    (True, 16, 'inference')
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import torch

from lmforge.cost.report import tag_line
from lmforge.models.stack import TransformerStack
from lmforge.models.transformer import Transformer, packed_layer_weights
from lmforge.nn.moe import moe_layers
from lmforge.nn.static_kv_cache import StaticKVCache
from lmforge.training.price_tag import PriceSettings, PriceTag, open_meter
from lmforge.utils.io import atomic_write_text



def _cache_of(module: torch.nn.Module) -> dict:
    """The module's own cache of its FLOP coefficients: a plain attribute, read after every forward (a
    WeakKeyDictionary would make a new weak reference on every lookup)."""
    cache = module.__dict__.get("_inference_flops")
    if cache is None:
        cache = module.__dict__["_inference_flops"] = {}
    return cache


def _coefficients(model: Transformer, source_len: int = 0) -> tuple[int, int, int, int]:
    """(encoder, per_token, per_key, head) training FLOPs of ``model``: a source of ``source_len`` tokens costs
    ``encoder`` once, each target token ``per_token`` plus ``per_key`` per key it attends to (cross-attention
    included in ``per_token``), of which ``head`` is the vocabulary projection. Worked out once per model
    (and source length): counting parameters walks the module tree."""
    cache = _cache_of(model)
    cfg = model.config
    key = source_len if cfg.arch == "encoder-decoder" else 0
    if key not in cache:
        if cfg.arch == "encoder-decoder":
            S = max(1, source_len)
            f1, f2, f3 = (model.train_flops(S, t) for t in (1, 2, 3))
        else:
            f1, f2, f3 = (model.train_flops(t) for t in (1, 2, 3))
        # train_flops(T) = a + b·T + c·T² exactly (c = 12·L·d_attn per key; a = the encoder, or 0)
        c = (f3 - 2 * f2 + f1) // 2
        b = f2 - f1 - 3 * c
        a = f1 - b - c
        head = sum(p.numel() for m in (model.mlm_head, model.lm_head, model.rtd_head) if m is not None
                   for p in m.parameters())
        if cfg.head in ("lm", "mlm") and cfg.tie_embeddings:
            head += cfg.vocab_size * cfg.embed_dim
        cache[key] = (a, b, c, 6 * head)
    return cache[key]


def forward_flops(model: Transformer, batch: int, new_tokens: int, keys: int | None = None,
                  head_rows: int | None = None, source_len: int = 0, encoder: bool = True) -> int:
    """Analytic FLOPs of one forward: ``batch`` rows of ``new_tokens`` tokens, each query attending to ``keys``
    keys (default ``new_tokens``: no cache), the vocabulary projection over ``head_rows`` positions per row
    (default all). An encoder-decoder's ``new_tokens`` are target tokens; its encoder over ``source_len`` tokens
    is charged when ``encoder``.

    Example (one cached decoding step after a 7-token prompt costs one token's weights and 8 keys):
        >>> import lmforge
        >>> m = lmforge.build_model("gpt-tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=10)
        >>> cfg = m.config
        >>> N = m.active_parameters(exclude_embeddings=True) + cfg.vocab_size * cfg.d_model  # tied head
        >>> forward_flops(m, 1, 1, keys=8) == 2 * N + cfg.n_layers * 4 * cfg.d_model * 8
        True
    """
    a, b, c, head = _coefficients(model, source_len)
    window = model.config.sliding_window
    k = new_tokens if keys is None else keys
    k = k if window is None else min(k, window)
    rows = new_tokens if head_rows is None else min(head_rows, new_tokens)
    train = new_tokens * (b - head + c * k) + rows * head
    if model.config.arch == "encoder-decoder" and encoder:
        train += a
    return batch * train // 3


def generation_flops(model: Transformer, prompt_len: int, generated: int, source: bool = False) -> int:
    """FLOPs of one KV-cached generation: the prompt's forward (logits of its last position), then one step per
    generated token but the last (whose logits are never needed). ``source``: an encoder-decoder's prompt is
    its source, read by the encoder once; its decoder starts from one start token.

    Example:
        >>> import lmforge
        >>> m = lmforge.build_model("gpt-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=10)
        >>> generation_flops(m, 4, 3) == forward_flops(m, 1, 4, head_rows=1) + sum(
        ...     forward_flops(m, 1, 1, keys=k) for k in (5, 6))
        True
    """
    if model.config.arch == "encoder-decoder":
        total = forward_flops(model, 1, 1, head_rows=1, source_len=prompt_len)
        return total + sum(forward_flops(model, 1, 1, keys=1 + i, source_len=prompt_len, encoder=False)
                           for i in range(1, max(generated, 1)))
    total = forward_flops(model, 1, prompt_len, head_rows=1)
    return total + sum(forward_flops(model, 1, 1, keys=prompt_len + i) for i in range(1, max(generated, 1)))


def _shape(x) -> tuple[int, int] | None:
    return (x.shape[0], x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else None


def call_flops(model: Transformer, args: tuple, kwargs: dict[str, Any]) -> tuple[int, int]:
    """(FLOPs, new tokens) of one finished call of ``model`` (its arguments, read after the forward: a KV cache
    already holds the new tokens)."""
    kw = dict(zip(("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids"), args))
    kw.update(kwargs)
    source = _shape(kw.get("input_ids")) or _shape(kw.get("inputs_embeds"))
    cache = kw.get("past_key_values")
    n_logits = kw.get("logits_to_keep") or 0
    if model.config.arch == "encoder-decoder":
        memory = kw.get("encoder_hidden_states")
        target = (_shape(kw.get("decoder_input_ids")) or _shape(kw.get("decoder_inputs_embeds"))
                  or _shape(kw.get("labels")))
        S = source[1] if source is not None else (_shape(memory) or (0, 0))[1]
        if target is None:  # the encoder alone (an encoder-decoder used as an encoder)
            if source is None:
                return 0, 0
            a, *_ = _coefficients(model, S)
            return source[0] * a // 3, source[0] * S
        B, T = target
        keys = _cache_keys(cache, T)
        flops = forward_flops(model, B, T, keys, n_logits or None, S, encoder=memory is None and source is not None)
        return flops, B * T
    if source is None:
        return 0, 0
    B, T = source
    return forward_flops(model, B, T, _cache_keys(cache, T), n_logits or None), B * T


def stack_flops(stack: TransformerStack, batch: int, tokens: int) -> int:
    """FLOPs of a stack run on its own, outside its model's forward (``Transformer.encode``: sentence embeddings,
    probes): 2 per layer weight and token (a token's routed experts only) plus 4·d_attn per key and layer.

    Example (the stack of an encoder is its model's forward less the head):
        >>> import lmforge
        >>> m = lmforge.build_model("bert-tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=10)
        >>> stack_flops(m.encoder, 1, 8) == forward_flops(m, 1, 8, head_rows=0)
        True
    """
    cache = _cache_of(stack)
    if "weights" not in cache:
        inactive = sum((layer.n_experts - layer.top_k) * sum(p.numel() for p in layer.experts.parameters())
                       // layer.n_experts for layer in moe_layers(stack.layers))
        # the rest of the stack (its final and embedding norms, token-type table) counts as in train_flops;
        # a position table is a lookup
        layers = {id(p) for p in stack.layers.parameters()}
        rest = sum(p.numel() for name, p in stack.named_parameters()
                   if id(p) not in layers and not name.endswith("positions.weight"))
        cache["weights"] = packed_layer_weights(stack) - inactive * stack.n_layers // len(stack.layers) + rest
        cache["d_attn"] = stack.layers[0].attn.q.weight.shape[0]
    keys = tokens if stack.window is None else min(tokens, stack.window)
    return batch * tokens * (2 * cache["weights"] + 4 * stack.n_layers * cache["d_attn"] * keys)


def _cache_keys(cache, new_tokens: int) -> int:
    """Keys each new query attends to: what the cache holds after the forward (a static cache: its whole
    capacity, which its step masks but still computes)."""
    if cache is None:
        return new_tokens
    if isinstance(cache, StaticKVCache):
        return int(cache.capacity)
    return max(int(cache.seq_len()), new_tokens)


# ---------------------------------------------------------------------------------------------- the tag
_OPEN: list["InferenceTag"] = []
# Hooks on the models themselves, not PyTorch's global forward hooks: a global hook runs for every module call
# and takes every module off its fast path (10-15% of a small decoder's decoding step, measured). Models built
# while a tag is open are found as they are built, by PyTorch's global module-registration hook (it runs when a
# submodule is assigned, never in a forward); models built before are given to :meth:`InferenceTag.watch`.
_WATCHED: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()
_REGISTRATION: list[Any] = []
_DEPTH = [0]  # Transformer forwards running: a stack inside one is counted with it, a stack alone by itself


def _enter_model(module, args) -> None:
    _DEPTH[0] += 1


def _after_model(module, args, kwargs, output) -> None:
    _DEPTH[0] -= 1
    if _OPEN and not _compiling():
        _charge(*call_flops(module, args, kwargs))


def _after_stack(module, args, kwargs, output) -> None:
    if _DEPTH[0] == 0 and _OPEN and not _compiling():
        shape = _shape(args[0] if args else kwargs.get("tokens"))
        if shape is not None:
            _charge(stack_flops(module, *shape), shape[0] * shape[1])


def _compiling() -> bool:
    if torch.compiler.is_compiling():  # traced into a graph: nothing here would run again
        for tag in _OPEN:
            tag.missed_compiled = True
        return True
    return False


def _charge(flops: int, tokens: int) -> None:
    for tag in _OPEN:
        tag.flops += flops
        tag.tokens += tokens
        tag.forwards += 1


def _watch_one(module) -> None:
    if module in _WATCHED:
        return
    if isinstance(module, Transformer):
        # always_call: a forward that raises still leaves the depth count right
        _WATCHED[module] = [module.register_forward_pre_hook(_enter_model),
                            module.register_forward_hook(_after_model, with_kwargs=True, always_call=True)]
    elif isinstance(module, TransformerStack):
        _WATCHED[module] = [module.register_forward_hook(_after_stack, with_kwargs=True)]


def _on_registration(module, name, submodule) -> None:
    _watch_one(module)
    if submodule is not None:
        _watch_one(submodule)


class InferenceTag:
    """FLOPs (every Transformer forward while open), device-seconds, energy, CO2e and dollars of one command.

    ``with InferenceTag(settings, command="generate") as tag: ...``; then :meth:`summary` (the JSON that
    ``lmforge cost`` reads), :meth:`line` (one line for stderr), :meth:`write` (the JSON, atomically).
    """

    def __init__(self, settings: PriceSettings | None = None, command: str = "", measure_energy: bool = True):
        self.settings = settings or PriceSettings()
        self.command = command
        self.price = PriceTag(self.settings, open_meter(self.settings.device) if measure_energy else None)
        self.flops = 0
        self.tokens = 0
        self.forwards = 0
        self.missed_compiled = False
        self._closed = False

    def __enter__(self) -> "InferenceTag":
        if not _REGISTRATION:
            _DEPTH[0] = 0
            _REGISTRATION.append(torch.nn.modules.module.register_module_module_registration_hook(_on_registration))
        _OPEN.append(self)
        self.price.start()
        return self

    def watch(self, *models: torch.nn.Module) -> "InferenceTag":
        """Count ``models`` too (each Transformer and stack in them): models built before the tag was opened."""
        for model in models:
            for module in model.modules():
                _watch_one(module)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop counting: the span's device-seconds and energy are added once."""
        if self._closed:
            return
        self._closed = True
        seconds, joules, device_s, cpu = self.price.rank_values()
        self.price.add(self.tokens, self.flops, seconds, joules, device_s, cpu)
        if self in _OPEN:
            _OPEN.remove(self)
        if not _OPEN:
            while _REGISTRATION:
                _REGISTRATION.pop().remove()
            for handles in list(_WATCHED.values()):
                for handle in handles:
                    handle.remove()
            _WATCHED.clear()

    def flops_method(self) -> str:
        if self.forwards == 0:
            return ("none: no lmforge Transformer forward ran (a baseline, the biLSTM or an HF wrapper has no "
                    "formula)") if not self.missed_compiled else "none: every forward was torch.compile-d"
        method = "analytic: forward 2N per token + 4 d_attn per key and layer (train_flops / 3), per forward call"
        return method + ("; torch.compile-d forwards not counted" if self.missed_compiled else "")

    def summary(self) -> dict[str, Any]:
        """The tag as ``lmforge cost`` reads it (training's fields, ``kind`` "inference", the command)."""
        out = self.price.summary()
        out.update(kind="inference", command=self.command, forwards=self.forwards, flops_method=self.flops_method())
        out.pop("flop_check", None)
        return out

    def line(self) -> str:
        """``lmforge COMMAND: price tag: ...`` (FLOPs, device-hours, energy, CO2e, dollars)."""
        return f"lmforge {self.command}: price tag: {tag_line(self.summary())}"

    def write(self, path: str | Path) -> Path:
        """Write :meth:`summary` to ``path`` (a folder gets ``price_tag.json`` in it), atomically."""
        path = Path(path)
        if path.is_dir():
            path = path / "price_tag.json"
        atomic_write_text(path, json.dumps(self.summary(), indent=1) + "\n")
        return path


def request_price(model, jobs: list[tuple[int, int]], device_s: float, settings: PriceSettings) -> dict[str, Any]:
    """One served request's price: the generation FLOPs of its ``jobs`` ((prompt tokens, generated tokens)
    each; 0 for a model with no formula), the device-seconds given, and the energy (estimated: device-seconds x
    power), CO2e and dollars they make under ``settings``.

    Example:
        >>> p = request_price(None, [(4, 2)], 36.0, PriceSettings.resolve("cpu", power_watts=100, grid_intensity=500))
        >>> p["flops"], p["energy_j"], p["co2e_g"], p["cost_usd"]
        (0, 3600.0, 0.5, 0.0005)
    """
    flops = sum(generation_flops(model, p, g) for p, g in jobs) if isinstance(model, Transformer) else 0
    derived = settings.derived(device_s, None)
    return {"flops": int(flops), "device_s": round(device_s, 6), "energy_j": round(derived["energy_kwh"] * 3.6e6, 6),
            "co2e_g": float(f"{derived['co2e_kg'] * 1000:.6g}"), "cost_usd": float(f"{derived['cost_usd']:.6g}")}
