"""``lmforge cost``: the price tag of a run (or the sum over an experiment's runs), or an estimate before one.

Example::

    $ lmforge cost runs/gpt                      # FLOPs, tokens, hours, kWh, CO2e, $ beside Strubell et al.
    $ lmforge cost experiments/sweep --json      # the sum over every run folder below
    $ lmforge cost --plan --model gpt2 --tokens 1e9 --device cpu
"""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.cli._price_args import add_price_flags
from lmforge.cost.estimate import estimate
from lmforge.cost.report import REFERENCE_SOURCE, format_tag, price_tag, reference_rows
from lmforge.errors import UserInputError
from lmforge.training.price_tag import DEVICE_KINDS, GRID_INTENSITY, PriceSettings
from lmforge.utils.flags import key_values
from lmforge.utils.folder_kinds import MODELS, require_kind



def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cost", help="the price tag of a run or experiment (FLOPs, kWh, CO2e, $), or an estimate before running",
        description="Print what a run cost: FLOPs, tokens, wall and device hours, energy (measured or estimated, "
                    "with the method), CO2e and dollars, beside the lecture's reference points (" + REFERENCE_SOURCE
                    + "). An experiment folder (run folders below it) shows the sum over its runs. With --plan, "
                    "estimate a run before starting it from its FLOP count and a short throughput probe.")
    parser.add_argument("run", nargs="?", metavar="RUN",
                        help="a run folder, an experiment folder, or a price-tag file written by --price-tag")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--plan", action="store_true", help="estimate a run before running it (needs --model, "
                                                            "--tokens)")
    parser.add_argument("--model", default=None, help="--plan: preset name or config file")
    parser.add_argument("--override", action="append", default=None, metavar="KEY=VALUE",
                        help="--plan: set a ModelConfig field, e.g. --override n_layers=2 (repeatable)")
    parser.add_argument("--tokens", type=float, default=None, help="--plan: training tokens, e.g. 1e9")
    parser.add_argument("--device", default="cpu", help=f"--plan: where it would run ({', '.join(DEVICE_KINDS)})")
    parser.add_argument("--seq-len", type=int, default=None, help="--plan: sequence length (default: the model's)")
    parser.add_argument("--batch-size", type=int, default=8, help="--plan: batch size of the throughput probe")
    parser.add_argument("--probe-steps", type=int, default=3, help="--plan: timed steps of the throughput probe")
    parser.add_argument("--flops-per-second", type=float, default=None,
                        help="--plan: achieved training FLOP/s, instead of measuring it with a probe")
    add_price_flags(parser, ", ".join(GRID_INTENSITY), run_defaults=True)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.plan:
        if not args.model or args.tokens is None:
            raise UserInputError("--plan needs --model PRESET and --tokens N")
        if args.probe_steps < 1:
            raise UserInputError(f"--probe-steps {args.probe_steps}: must be >= 1")
        settings = PriceSettings.resolve(args.device, args.region, args.grid_intensity, args.power_watts,
                                         args.price_per_hour)
        est = estimate(args.model, args.tokens, settings, args.seq_len, args.batch_size,
                       key_values(args.override, "--override"), args.flops_per_second, args.probe_steps)
        if args.json:
            print(json.dumps(est))
            return 0
        print(f"estimate for {est['model']} ({est['non_embedding_parameters']:,} non-embedding parameters) on "
              f"{est['tokens']:,} tokens of length {est['seq_len']}")
        print(f"  FLOPs        {est['total_flops']:.4g} (analytic)")
        print(f"  throughput   {est['flops_per_second']:.4g} FLOP/s ({est['throughput_method']})")
        print(f"  time         {est['seconds'] / 3600:.4g} device-h")
        print(f"  energy       {est['energy_kwh']:.4g} kWh (estimated: {settings.power_watts:g} W)")
        print(f"  CO2e         {est['co2e_kg']:.4g} kg at {settings.grid_intensity:g} g/kWh ({settings.region})")
        print(f"  cost         ${est['cost_usd']:.4g} at ${settings.price_per_hour:g}/device-h")
        print(f"for scale, CO2e in lbs ({REFERENCE_SOURCE}):")
        for name, lbs in reference_rows(est["co2e_kg"]):
            print(f"  {name:<42} {lbs:>14,.6g}")
        return 0
    if not args.run:
        raise UserInputError("give a RUN folder, or --plan with --model and --tokens")
    # What training wrote carries price tags: a tokenizer, shards, an adapter or an index never do.
    if not (Path(args.run).is_file() and args.run.endswith(".json")):  # an inference command's --price-tag FILE
        require_kind(args.run, ("run", "experiment", "quickstart", "checkpoint", "baseline", "bilm", *MODELS), "cost",
                     "RUN")
    tag = price_tag(args.run, args.region, args.grid_intensity, args.price_per_hour, args.power_watts)
    if args.json:
        print(json.dumps({**tag, "references_lbs_co2e": dict(reference_rows(tag["co2e_kg"])[1:]),
                          "references_source": REFERENCE_SOURCE}))
    else:
        print(format_tag(tag))
    return 0
