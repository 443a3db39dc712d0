"""``lmforge plan``: the compute-optimal model size and token count for a compute budget (Chinchilla).

Example::

    $ lmforge plan --compute 5.76e23                         # ~70B parameters, ~1.4T tokens
    $ lmforge plan --budget-hours 1 --device cpu --n 1e6 --d 2e7
    $ lmforge plan --compute 1e18 --fit sweep/scaling_fit.json
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from lmforge.cost.chinchilla import PUBLISHED, ScalingLaw
from lmforge.cost.estimate import probe_throughput
from lmforge.cost.shapes import nearest_preset, scaled_shape
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training.price_tag import DEVICE_KINDS, PriceSettings


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
    parser.add_argument("--device", default="cpu", help=f"device of --budget-hours ({', '.join(DEVICE_KINDS)})")
    parser.add_argument("--flops-per-second", type=float, default=None,
                        help="achieved FLOP/s of --device (default: measured with a probe of --base)")
    parser.add_argument("--fit", default=None, metavar="FILE", help="scaling_fit.json from `lmforge scaling fit`")
    parser.add_argument("--base", default="gpt-tiny", help="preset whose shape is scaled to the optimal size")
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


def run(args) -> int:
    law = _law(args.fit)
    if args.compute is not None:
        compute, how = args.compute, "given"
    else:
        if not (args.budget_hours > 0 and math.isfinite(args.budget_hours)):
            raise UserInputError(f"--budget-hours {args.budget_hours}: must be > 0")
        device = PriceSettings.resolve(args.device).device
        rate = args.flops_per_second
        if rate is None:
            import torch

            from lmforge.config import resolve_config
            from lmforge.models.transformer import Transformer

            if device == "cuda" and not torch.cuda.is_available():
                raise UserInputError("--device cuda: no CUDA device on this machine; use --device cpu")
            cfg = resolve_config(args.base)
            rate = probe_throughput(Transformer(cfg), device, 8, min(cfg.max_seq_len, 128))
            how = f"{args.budget_hours:g} h x {rate:.3g} FLOP/s measured on {device} with {args.base}"
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
    preset, preset_n = nearest_preset(n_opt)
    shape = scaled_shape(args.base, n_opt)
    out = {"compute": compute, "compute_from": how, "law": law.source, "n_opt": n_opt, "d_opt": d_opt,
           "tokens_per_param": d_opt / n_opt, "loss_opt": law.loss(n_opt, d_opt),
           "nearest_preset": {"name": preset, "n": preset_n},
           "scaled_shape": {"base": args.base, **shape}}
    if args.n is not None:
        d = args.d if args.d is not None else compute / (6 * args.n)
        out["yours"] = {"n": args.n, "d": d, "loss": law.loss(args.n, d), "compute": 6 * args.n * d}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"budget      {compute:.4g} FLOPs ({how})")
    print(f"law         {law.source}")
    print(f"optimum     N = {n_opt:.4g} parameters, D = {d_opt:.4g} tokens ({d_opt / n_opt:.1f} tokens/parameter), "
          f"predicted loss {out['loss_opt']:.4f}")
    print(f"nearest preset  {preset} (N = {preset_n:,})")
    print(f"scaled {args.base}  " + ", ".join(f"{k}={v}" for k, v in shape["overrides"].items())
          + f" (N = {shape['n']:,})")
    if "yours" in out:
        y = out["yours"]
        print(f"yours       N = {y['n']:.4g}, D = {y['d']:.4g}: predicted loss {y['loss']:.4f} "
              f"({y['loss'] - out['loss_opt']:+.4f} against the optimum; uses {y['compute']:.3g} FLOPs)")
    return 0
