"""``lmforge quantize``: convert a model folder to int8 or int4 weights and report what it cost.

Example::

    $ lmforge quantize --model runs/gpt/model --to int8 --out runs/gpt-int8
    $ lmforge generate --model runs/gpt-int8 --prompt "She was"

The output is a model folder (``quantization.json`` records the layers converted) that every inference
command loads as saved. The report gives perplexity on held-out bundled text against fp32, and greedy
agreement with fp32 over a fixed prompt set (see :mod:`lmforge.tasks.quantize`).
"""

from __future__ import annotations

import json

from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import model_argument, plain_warnings
from lmforge.nn.weight_only import MODES
from lmforge.tasks.quantize import quantize_folder
from lmforge.utils.io import atomic_write_text


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "quantize", help="convert a model folder to int8/int4 weights and report its quality vs fp32",
        description="Quantise the linear layers of a decoder model folder (int8 per output row, int4 per group; "
        "on x86 CPUs int8 layers also round their activations per call, for an integer matmul), save it as a "
        "model folder that loads without re-quantising, and report perplexity on held-out bundled text and greedy "
        "agreement, each against the fp32 model. int4 layers whose input width is not a multiple of the group size "
        "stay in full precision (a notice names each).",
    )
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="full-precision model folder with its tokenizer.json, or a run folder")
    parser.add_argument("--to", required=True, choices=MODES, help="int8 (per output row) or int4 (per group)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the quantised model folder to write")
    parser.add_argument("--group-size", type=int, default=32, choices=(32, 64, 128, 256), metavar="N",
                        help="int4: inputs sharing one scale, 32 (default), 64, 128 or 256")
    parser.add_argument("--report", default=None, metavar="FILE", help="also write the quality report as JSON")
    add_load_flags(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    with plain_warnings("quantize"):
        report = quantize_folder(model_argument("quantize", args.model), args.to, args.out, args.group_size)
    for line in report.lines():
        print(line)
    print(f"saved         {args.out}")
    if args.report:
        atomic_write_text(args.report, json.dumps(report.to_dict(), indent=1) + "\n")
    return 0
