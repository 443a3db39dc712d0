"""``lmforge benchmark``: fine-tune and evaluate every task of a benchmark suite (GLUE), as BERT's table did.

Example::

    $ lmforge benchmark glue --model runs/bert/model --data-dir ~/glue_data --out runs/glue --epochs 3 \\
          --batch-size 32 --lr 2e-5 --warmup-ratio 0.1
    $ cat runs/glue/table.md          # every metric, each task's score and the GLUE score
    $ ls runs/glue/submission         # CoLA.tsv SST-2.tsv ... MNLI-m.tsv MNLI-mm.tsv AX.tsv

Running the same command again continues: finished tasks are kept, an interrupted one resumes.
"""

from __future__ import annotations

import argparse
import sys

from lmforge.cli.finetune import _add_trainer_flags
from lmforge.cli.main import plain_warnings
from lmforge.evaluation.benchmark_suite import SUITES, TABLE_FILE, run_suite
from lmforge.utils.io import make_folder


def run(args) -> int:
    given = {k: v for k, v in vars(args).items() if k not in ("func", "suite", "tasks", "verb")}
    make_folder(args.out)
    with plain_warnings("benchmark"):
        result = run_suite(args.suite, given, args.out, args.tasks.split(",") if args.tasks else None,
                           log=lambda line: print(line, file=sys.stderr))
    print(open(f"{args.out}/{TABLE_FILE}", encoding="utf-8").read(), end="")
    print(f"wrote {args.out}/{TABLE_FILE}, results.json and {len(result['submission'])} submission files")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "benchmark", help="fine-tune and evaluate every task of a suite (glue): its table, average and test "
                          "submission files", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS)
    parser.add_argument("suite", choices=list(SUITES), help="the suite: glue")
    parser.add_argument("--model", required=True, help="preset name, lmforge model folder or Hugging Face folder")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (needed for presets)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="the suite's folder in its official layout (else $LMFORGE_GLUE_DIR)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder of the suite: one run folder per task, "
                        "table.md, results.json, submission/")
    parser.add_argument("--tasks", default=None, metavar="A,B",
                        help="only these tasks, e.g. cola,mrpc (default: all; the average then covers those run)")
    parser.add_argument("--max-length", dest="max_length", type=int, default=None,
                        help="input tokens per example (default 256)")
    parser.add_argument("--epochs", type=float, default=None, help="passes over each task's training data (sets "
                        "--max-steps per task)")
    parser.add_argument("--warmup-ratio", type=float, default=None, help="warmup as a share of each task's steps")
    _add_trainer_flags(parser)
    parser.set_defaults(func=run)
