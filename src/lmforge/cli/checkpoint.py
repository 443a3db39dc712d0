"""``lmforge checkpoint``: work with training checkpoints.

``consolidate`` turns a training checkpoint (a sharded FSDP one written by any number of ranks, or a plain
one) into a model folder with one ``model.safetensors``, which ``lmforge.load`` reads.

Example::

    $ lmforge checkpoint consolidate runs/gpt/checkpoints/step-00002000 models/gpt-2000
    $ lmforge checkpoint consolidate runs/gpt models/gpt-latest     # the run's newest intact checkpoint
    $ lmforge checkpoint average runs/mt --last 5 --out models/mt-avg5  # Vaswani et al.'s averaged model
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmforge.cli.main import UserError
from lmforge.training.checkpoint_average import average_checkpoints
from lmforge.training.dist_checkpoint import (
    find_checkpoint,
    is_sharded,
    write_model_folder,
)
from lmforge.utils.folder_kinds import require_kind


def run_consolidate(args) -> int:
    src, dst = Path(args.src), Path(args.dst)
    if not src.exists():
        raise UserError(f"{src}: no such checkpoint, checkpoints folder or run folder")
    require_kind(src, ("run", "checkpoint"), "checkpoint consolidate", "SRC")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise UserError(f"{dst}: the output must lie outside the checkpoint it is made from")
    if args.tokenizer is not None and not Path(args.tokenizer).exists():
        raise UserError(f"--tokenizer {args.tokenizer}: no such tokenizer folder or file")
    folder = find_checkpoint(src)
    out = write_model_folder(folder, dst, tokenizer=args.tokenizer)
    layout = "sharded" if is_sharded(folder) else "plain"
    print(f"{folder} ({layout}) -> {out}", file=sys.stderr)
    return 0


def run_average(args) -> int:
    run = Path(args.run)
    require_kind(run, ("run", "checkpoint"), "checkpoint average", "RUN")
    out = Path(args.out) if args.out else run / f"model-avg{args.last}"
    if args.tokenizer is not None and not Path(args.tokenizer).exists():
        raise UserError(f"--tokenizer {args.tokenizer}: no such tokenizer folder or file")
    written = average_checkpoints(run, args.last, out, tokenizer=args.tokenizer)
    print(f"average of the last {args.last} checkpoints of {run} -> {written}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("checkpoint", help="work with training checkpoints (consolidate to a model)")
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND")
    cons = sub.add_parser(
        "consolidate",
        help="write a training checkpoint's weights as a single-file model folder",
        description="Write the weights of a training checkpoint as a model folder (config.json + one "
                    "model.safetensors, plus the run's tokenizer) that lmforge.load reads. SRC is a "
                    "checkpoint folder (step-NNNNNNNN), a checkpoints folder or a run folder (their newest intact "
                    "checkpoint). Sharded FSDP checkpoints from any number of ranks are gathered into full "
                    "tensors; one process and no GPU are needed. The checkpoint is only read.",
    )
    cons.add_argument("src", metavar="SRC", help="checkpoint folder, checkpoints folder or run folder")
    cons.add_argument("dst", metavar="DST", help="model folder to write (replaced atomically)")
    cons.add_argument("--tokenizer", metavar="DIR", default=None,
                      help="tokenizer to include (default: the run's tokenizer/ folder, when SRC is inside a run)")
    cons.set_defaults(func=run_consolidate)
    avg = sub.add_parser(
        "average",
        help="average the weights of a run's last K checkpoints into a model folder",
        description="Average the weights of the last K checkpoints of a run (Vaswani et al. 2017: the last 5 for "
                    "the base Transformer, 20 for big) into a model folder that lmforge.load reads. Every float "
                    "tensor is the mean of the K checkpoints' tensors; each checkpoint is verified first. The "
                    "checkpoints are only read.",
    )
    avg.add_argument("run", metavar="RUN", help="run folder (or its checkpoints folder)")
    avg.add_argument("--last", type=int, required=True, metavar="K", help="how many of the newest checkpoints to average")
    avg.add_argument("--out", metavar="DIR", default=None,
                     help="model folder to write, replaced atomically (default: RUN/model-avgK)")
    avg.add_argument("--tokenizer", metavar="DIR", default=None,
                     help="tokenizer to include (default: the run's tokenizer/ folder)")
    avg.set_defaults(func=run_average)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)
