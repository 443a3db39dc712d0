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
from lmforge.cli.main import UserError, plain_warnings
from lmforge.evaluation.benchmark_suite import SUITES, TABLE_FILE, run_suite
from lmforge.utils.folder_kinds import TRAINABLE, require_kind
from lmforge.utils.io import make_folder
from lmforge.utils.lock import removed_on_failure


def run(args) -> int:
    given = {k: v for k, v in vars(args).items() if k not in ("func", "suite", "tasks", "verb")}
    suite, tasks = args.suite, args.tasks.split(",") if args.tasks else None
    if "/" in suite:  # one task by name, e.g. glue/sst2: the suite's run of that task alone
        if tasks:
            raise UserError(f"{suite} names one task; drop --tasks, or name the suite ({suite.split('/')[0]})")
        suite, tasks = suite.split("/", 1)[0], [suite]
    with plain_warnings("benchmark"):
        if suite not in SUITES:
            raise UserError(f"unknown benchmark suite {suite!r} (known: {', '.join(SUITES)}; or one of its tasks by "
                            "name, e.g. glue/sst2)")
        require_kind(args.model, TRAINABLE, "benchmark", "--model")  # before --out is made
        # A refused suite (no usable data) leaves no empty folder behind; one holding a task's run is kept.
        with removed_on_failure(args.out, keep=lambda out: any(out.iterdir())):
            make_folder(args.out)
            result = run_suite(suite, given, args.out, tasks, log=lambda line: print(line, file=sys.stderr))
    print(open(f"{args.out}/{TABLE_FILE}", encoding="utf-8").read(), end="")
    print(f"wrote {args.out}/{TABLE_FILE}, results.json and {len(result['submission'])} submission files")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "benchmark", help="fine-tune and evaluate every task of a suite (glue): its table, average and test "
                          "submission files", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS)
    parser.add_argument("suite", metavar="SUITE", help=f"the suite ({', '.join(SUITES)}), or one of its tasks by name "
                        "(e.g. glue/sst2)")
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
