"""Estimate a run's price tag before running it: its FLOPs, and this machine's measured throughput.

    FLOPs   = train_flops(T) / T x tokens                  (analytic, as the Trainer counts them)
    seconds = FLOPs / achieved FLOP/s                      (a short probe: a few real training steps)

then energy, CO2e and dollars as :mod:`lmforge.training.price_tag` turns device-seconds into them. The probe
runs forward, backward and an AdamW step on random tokens, after one warm-up step, and times the rest.

Example:
    >>> from lmforge.training.price_tag import PriceSettings
    >>> est = estimate("gpt-tiny", 1e6, PriceSettings(), flops_per_second=1e9, overrides={"n_layers": 1})
    >>> est["seconds"] == est["total_flops"] / 1e9, est["throughput_method"]
    (True, 'given')
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from lmforge.config import resolve_config
from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer
from lmforge.training.price_tag import PriceSettings, batch_flops


def probe_throughput(model: Transformer, device: str, batch_size: int, seq_len: int, steps: int = 3,
                     warmup: bool = True) -> float:
    """Achieved training FLOP/s of ``model`` on ``device``: ``steps`` timed steps after one warm-up step (none
    with ``warmup=False``: the model has run on ``device`` already)."""
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len), device=device)
    batch = {"input_ids": ids, "labels": ids}
    if model.config.arch == "encoder-decoder":
        batch["decoder_input_ids"] = ids
    flops = batch_flops(model, batch, ids.numel())
    elapsed = 0.0
    for step in range(0 if warmup else 1, steps + 1):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if step:  # the first step warms up allocators and kernels
            elapsed += time.perf_counter() - start
    return flops * steps / elapsed


def throughput_spread(model: Transformer, device: str, batch_size: int, seq_len: int, probes: int = 5,
                      steps: int = 1) -> dict[str, Any]:
    """The median FLOP/s of ``probes`` short probes (:func:`probe_throughput`), with their min and max.

    One probe on a shared host measures whatever else ran during it: two runs minutes apart differed 2.5x. The
    median of several short ones ignores the probes another process slowed down, and the spread shows how much
    to trust it. Only the first probe runs a warm-up step (allocators, kernels): the others reuse it.
    """
    if probes < 1:
        raise UserInputError(f"--probes {probes}: must be >= 1")
    rates = [probe_throughput(model, device, batch_size, seq_len, steps, warmup=i == 0) for i in range(probes)]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "rates": rates}


def estimate(model: str, tokens: float, settings: PriceSettings, seq_len: int | None = None, batch_size: int = 8,
             overrides: dict[str, Any] | None = None, flops_per_second: float | None = None,
             probe_steps: int = 3) -> dict[str, Any]:
    """The expected price tag of training ``model`` (a preset or config, with ``overrides``) on ``tokens``."""
    if not (tokens > 0 and math.isfinite(tokens)):
        raise UserInputError(f"--tokens {tokens}: must be a positive number of tokens")
    if batch_size < 1 or (seq_len is not None and seq_len < 2):
        raise UserInputError("--batch-size must be >= 1 and --seq-len >= 2")
    cfg = resolve_config(model).replace(**(overrides or {}))
    T = min(seq_len or cfg.max_seq_len, cfg.max_seq_len)
    with torch.device("meta"):
        counted = Transformer(cfg)
    total = counted.train_flops(T) / T * tokens
    if flops_per_second is None:
        if settings.device == "cuda" and not torch.cuda.is_available():
            raise UserInputError("--device cuda: no CUDA device on this machine; use --device cpu")
        torch.manual_seed(0)
        rate = probe_throughput(Transformer(cfg), settings.device, batch_size, T, probe_steps)
        how = f"measured: {probe_steps} training steps of batch {batch_size} x {T} on {settings.device}"
    else:
        if not flops_per_second > 0:
            raise UserInputError(f"--flops-per-second {flops_per_second}: must be > 0")
        rate, how = float(flops_per_second), "given"
    seconds = total / rate
    return {"model": cfg.name, "tokens": int(tokens), "seq_len": T, "total_flops": total,
            "flops_per_second": rate, "throughput_method": how, "seconds": seconds,
            "non_embedding_parameters": counted.num_parameters(True),
            **settings.derived(seconds, None), "settings": settings.__dict__}
