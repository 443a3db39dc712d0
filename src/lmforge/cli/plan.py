"""``lmforge plan``: the compute-optimal model size and token count for a compute budget (Chinchilla).

Example::

    $ lmforge plan --compute 5.76e23                         # ~70B parameters, ~1.4T tokens
    $ lmforge plan --budget-hours 1 --device cpu --n 1e6 --d 2e7
    $ lmforge plan --compute 1e18 --fit sweep/scaling_fit.json
    $ lmforge plan --budget-hours 1 --from runs/gpt --data data/austen   # runs/gpt's FLOP/s; D beside the data
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from lmforge.cost.chinchilla import PUBLISHED, ScalingLaw
from lmforge.cost.data_tokens import data_tokens
from lmforge.cost.estimate import throughput_spread
from lmforge.cost.report import read_tag
from lmforge.cost.shapes import FAMILIES, nearest_preset, preset_family, scaled_shape
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training.price_tag import DEVICE_KINDS, PRICE_TAG_FILE, PriceSettings


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="compute-optimal parameters and tokens for a FLOP or time budget (Chinchilla)",
        description="Return the compute-optimal N (non-embedding parameters) and D (tokens) for a budget, the "
                    "nearest bundled preset and a shape scaled from --base, and the loss the law predicts for "
                    "your own N and D against the optimum. The law is a `lmforge scaling fit` file (--fit) or, by "
                    "default, Chinchilla's published coefficients (labelled).")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--compute", type=float, help="training budget in FLOPs, e.g. 5.76e23")
    budget.add_argument("--budget-hours", type=float, help="training budget in device-hours on --device")
    parser.add_argument("--device", default=None, help=f"device of --budget-hours ({', '.join(DEVICE_KINDS)}; "
                                                       "default: cpu, or the device of --from)")
    parser.add_argument("--flops-per-second", type=float, default=None,
                        help="achieved FLOP/s of --device (default: the median of --probes short probes of --base)")
    parser.add_argument("--probes", type=int, default=5,
                        help="short throughput probes whose median is the FLOP/s (default 5; the spread is shown)")
    parser.add_argument("--from", dest="from_run", default=None, metavar="RUN",
                        help="take the FLOP/s a finished run measured (its price_tag.json: FLOPs / device-seconds) "
                             "instead of probing")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="your training data (a folder from `lmforge data prepare`, or text with --tokenizer): "
                             "warn when the plan needs more tokens than it holds")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="--data: the tokenizer that counts the tokens of raw text")
    parser.add_argument("--fit", default=None, metavar="FILE", help="scaling_fit.json from `lmforge scaling fit`")
    parser.add_argument("--base", default=None, help="preset whose shape is scaled to the optimal size "
                                                     "(default: gpt-tiny)")
    parser.add_argument("--family", default=None, choices=FAMILIES,
                        help="family of the nearest preset (default: that of --base when given, else dense: "
                             "every decoder but the mixtures of experts)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size V; no prediction is above ln V, a uniform guess (default: that of "
                             "--base)")
    parser.add_argument("--n", type=float, default=None, help="your model's non-embedding parameters, to compare")
    parser.add_argument("--d", type=float, default=None, help="your training tokens (default: what --n leaves of "
                                                             "the budget)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _law(path: str | None) -> ScalingLaw:
    if path is None:
        return PUBLISHED
    if not Path(path).is_file():
        raise InputFileNotFound(f"--fit {path}: no such file")
    try:
        return ScalingLaw.from_dict(json.loads(Path(path).read_text(encoding="utf-8"))["law"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserInputError(f"--fit {path}: not a scaling fit of `lmforge scaling fit` ({exc})") from None


def _bounded(law: ScalingLaw, n: float, d: float, vocab: int, what: str, outside: list[str]) -> float:
    loss, raw = law.bounded_loss(n, d, vocab)
    if raw is not None:
        outside.append(f"{what} {raw:.4g}")
    return loss


def _count(x: float) -> str:
    """A token count in three figures: 288k, 42.1M, 1.4T."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _run_rate(run: str, device_flag: str | None) -> tuple[float, str, str]:
    """FLOP/s, its description and the device kind, from a finished run's price tag (--from)."""
    folder = Path(run)
    if not folder.is_dir():
        raise InputFileNotFound(f"--from {run}: no such folder")
    if not (folder / PRICE_TAG_FILE).is_file():
        raise UserInputError(f"--from {run}: no {PRICE_TAG_FILE} in it; give a run folder that lmforge pretrain, "
                             "finetune or distill has trained in")
    tag = read_tag(folder)
    flops, device_s = tag.get("total_flops") or 0, tag.get("device_s") or 0
    if not (flops > 0 and device_s > 0):
        raise UserInputError(f"--from {folder / PRICE_TAG_FILE}: no FLOPs or device-seconds recorded yet")
    kind = (tag.get("settings") or {}).get("device", "cpu")
    if device_flag is not None and PriceSettings.resolve(device_flag).device != kind:
        raise UserInputError(f"--device {device_flag}: the run --from {run} ran on {kind}; drop --device or use "
                             f"--device {kind}")
    # device-seconds are what the run was billed: CPU seconds per thread on a CPU (old tags: wall seconds)
    billed = "CPU seconds / threads" if kind == "cpu" and "cpu_s" in tag else "wall seconds"
    return flops / device_s, (f"{flops / device_s:.3g} FLOP/s measured by {run}: {flops:.3g} FLOPs in "
                              f"{device_s:.4g} device-s ({billed})"), kind


def _capped(loss: float, capped: bool) -> str:
    return f"capped at {loss:.4f} (outside the law's range)" if capped else f"{loss:.4f}"


def run(args) -> int:
    law = _law(args.fit)
    from lmforge.config import resolve_config

    family = args.family
    if args.base is None:
        args.base = "gpt-tiny"
        family = family or "dense"
    base_cfg = resolve_config(args.base)
    if family is None:
        family = preset_family(args.base, base_cfg) if base_cfg.arch == "decoder" else "dense"
    vocab = args.vocab_size if args.vocab_size is not None else base_cfg.vocab_size
    if vocab < 2:
        raise UserInputError(f"--vocab-size {vocab}: must be at least 2")
    if args.probes < 1:
        raise UserInputError(f"--probes {args.probes}: must be >= 1")
    # the data is read before any probe runs: a wrong folder is a one-line error at once
    data = data_tokens(args.data, args.tokenizer) if args.data is not None else None
    if data is not None and data[0] < 1:
        raise UserInputError(f"--data {args.data}: holds no training tokens")
    spread = None
    if args.compute is not None:
        if args.from_run is not None:
            raise UserInputError("--from RUN: gives the FLOP/s of --budget-hours; with --compute it has no use")
        compute, how = args.compute, "given"
    else:
        if not (args.budget_hours > 0 and math.isfinite(args.budget_hours)):
            raise UserInputError(f"--budget-hours {args.budget_hours}: must be > 0")
        device = PriceSettings.resolve(args.device or "cpu").device
        rate = args.flops_per_second
        if args.from_run is not None:
            if rate is not None:
                raise UserInputError("--from and --flops-per-second: give one of them")
            rate, measured, device = _run_rate(args.from_run, args.device)
            how = f"{args.budget_hours:g} h x {measured}"
        elif rate is None:
            import torch

            from lmforge.models.transformer import Transformer

            if device == "cuda" and not torch.cuda.is_available():
                raise UserInputError("--device cuda: no CUDA device on this machine; use --device cpu")
            cfg = resolve_config(args.base)
            spread = throughput_spread(Transformer(cfg), device, 8, min(cfg.max_seq_len, 128), args.probes)
            rate = spread["median"]
            how = (f"{args.budget_hours:g} h x {rate:.3g} FLOP/s, the median of {args.probes} probes on {device} "
                   f"with {args.base} (spread {spread['min']:.3g}-{spread['max']:.3g})")
        elif not rate > 0:
            raise UserInputError(f"--flops-per-second {rate}: must be > 0")
        else:
            how = f"{args.budget_hours:g} h x {rate:.3g} FLOP/s (given)"
        compute = args.budget_hours * 3600 * rate
    if not (compute > 0 and math.isfinite(compute)):
        raise UserInputError(f"--compute {compute}: must be a positive number of FLOPs")
    for flag, value in (("--n", args.n), ("--d", args.d)):
        if value is not None and not value > 0:
            raise UserInputError(f"{flag} {value}: must be > 0")
    n_opt, d_opt = law.optimum(compute)
    preset, preset_n = nearest_preset(n_opt, family)
    shape = scaled_shape(args.base, n_opt)
    outside: list[str] = []
    out = {"compute": compute, "compute_from": how, "law": law.source, "n_opt": n_opt, "d_opt": d_opt,
           "tokens_per_param": d_opt / n_opt, "vocab_size": vocab,
           "loss_opt": _bounded(law, n_opt, d_opt, vocab, "the optimum", outside),
           "loss_opt_capped": bool(outside),
           "nearest_preset": {"name": preset, "n": preset_n, "family": family},
           "scaled_shape": {"base": args.base, **shape}}
    if spread is not None:
        out["throughput"] = spread
    if args.n is not None:
        d = args.d if args.d is not None else compute / (6 * args.n)
        before = len(outside)
        out["yours"] = {"n": args.n, "d": d, "loss": _bounded(law, args.n, d, vocab, "yours", outside),
                        "compute": 6 * args.n * d}
        out["yours"]["loss_capped"] = len(outside) > before
    # One line, whatever fell outside: a loss outside [0, ln V] is no model's, so the fit was extrapolated.
    out["warnings"] = [] if not outside else [
        f"warning: the law's loss for {' and '.join(outside)} nats is outside [0, ln V = {math.log(vocab):.4g}] "
        f"(V = {vocab}, a uniform guess): N and D lie outside the range of its fit, so the prediction is capped "
        f"and means nothing"]
    if data is not None:
        tokens, where = data
        out["data"] = {"path": args.data, "tokens": tokens, "counted": where, "epochs": d_opt / tokens}
        if d_opt > tokens:
            # what fits the data instead: the budget whose optimum trains on exactly the data, once
            line = (f"warning: the plan recommends {_count(d_opt)} tokens; {args.data} holds {_count(tokens)} "
                    f"({where}): that is {d_opt / tokens:,.{0 if d_opt / tokens >= 10 else 2}f} epochs")
            c_data = law.compute_for_tokens(tokens)
            if c_data is not None:
                n_data = law.optimum(c_data)[0]
                near, near_n = nearest_preset(n_data, family)
                out["data"]["at_data_size"] = {"compute": c_data, "n_opt": n_data, "d_opt": float(tokens),
                                               "nearest_preset": {"name": near, "n": near_n}}
                line += (f"; at D = {_count(tokens)} the compute-optimal model is N = {_count(n_data)} "
                         f"({c_data:.3g} FLOPs; nearest preset {near})")
            out["warnings"].append(line)
    for line in out["warnings"]:
        print(line, file=sys.stderr)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"budget      {compute:.4g} FLOPs ({how})")
    print(f"law         {law.source}")
    print(f"optimum     N = {n_opt:.4g} parameters, D = {d_opt:.4g} tokens ({d_opt / n_opt:.1f} tokens/parameter), "
          f"predicted loss {_capped(out['loss_opt'], out['loss_opt_capped'])}")
    print(f"nearest preset  {preset} (N = {preset_n:,}; family {family})")
    print(f"scaled {args.base}  " + ", ".join(f"{k}={v}" for k, v in shape["overrides"].items())
          + f" (N = {shape['n']:,})")
    if "yours" in out:
        y = out["yours"]
        gap = ("no gap to the optimum can be read" if y["loss_capped"] or out["loss_opt_capped"]
               else f"{y['loss'] - out['loss_opt']:+.4f} against the optimum")
        print(f"yours       N = {y['n']:.4g}, D = {y['d']:.4g}: predicted loss {_capped(y['loss'], y['loss_capped'])} "
              f"({gap}; uses {y['compute']:.3g} FLOPs)")
    return 0
