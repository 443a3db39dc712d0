"""``lmforge tasks``: the tasks lmforge knows by name (shipped ones, GLUE, SuperGLUE, SQuAD, SWAG).

Example::

    $ lmforge tasks list
    $ lmforge tasks show glue/mnli
    $ lmforge finetune --model bert-tiny --task glue/cola --data-dir ~/glue_data --out runs/cola
    $ lmforge tasks evaluate glue/cola --model runs/cola --data-dir ~/glue_data
"""

from __future__ import annotations

import json

from lmforge.cli.main import model_argument
from lmforge.cli.tokenizer import HELP
from lmforge.datasets import benchmarks as layouts
from lmforge.evaluation import benchmarks


def _list(args) -> int:
    header = f"{'name':19s} {'task':16s} {'metrics':34s} description"
    print(header)
    print("-" * len(header))
    for name in benchmarks.names():
        b = benchmarks.get(name)
        print(f"{name:19s} {b.task:16s} {', '.join(b.metrics):34s} {b.description}")
    print("\nData: the shipped tasks come with lmforge; the others are read in their official layout from "
          "--data-dir or the suite's variable (" + ", ".join(f"{s}: ${v[0]}" for s, v in layouts.SUITES.items())
          + ")")
    return 0


def _show(args) -> int:
    b = benchmarks.get(args.name)
    print(f"{b.name}: {b.description}")
    print(f"  task      {b.task}")
    print(f"  columns   {', '.join(f'{role}={col}' for role, col in b.columns.items())}")
    if b.labels:
        print(f"  labels    {', '.join(b.labels)}")
    print(f"  metrics   {', '.join(b.metrics)}")
    if b.name in layouts.LAYOUTS:
        layout = layouts.LAYOUTS[b.name]
        for split, file in layout.files.items():
            other = layout.alternatives.get(split)  # the same split in another official layout (WMT's SGML)
            print(f"  {split:9s} {file}" + (f" (or {', '.join(other)})" if other else ""))
    print(f"  data      {benchmarks.where(b.name)}")
    return 0


def _evaluate(args) -> int:
    scores = benchmarks.evaluate(model_argument("tasks evaluate", args.model, ("task", "baseline")), args.name, args.data_dir,
                                 args.batch_size, args.device)
    for key, value in scores.items():
        print(f"{key:24s} {value:.4f}")
    print(json.dumps(scores))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("tasks", help="list the tasks lmforge knows by name (GLUE, SuperGLUE, SQuAD, "
                                   "SNLI, RACE, IMDb ... and the shipped ones)",
                                   description="Tasks by name, for `lmforge finetune --task NAME`.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser("list", help="every task: its type, metrics and description", formatter_class=HELP)
    p.set_defaults(func=_list)
    p = verbs.add_parser("show", help="one task's columns, labels, metrics and files", formatter_class=HELP)
    p.add_argument("name", help="task name (see `lmforge tasks list`), e.g. glue/cola")
    p.set_defaults(func=_show)
    p = verbs.add_parser("evaluate", help="a fine-tuned model's leaderboard metrics on every evaluation split "
                         "(MNLI: matched and mismatched)", formatter_class=HELP)
    p.add_argument("name", help="task name, e.g. glue/mnli")
    p.add_argument("--model", required=True, metavar="DIR", help="task folder, or a run folder (its best/)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="the suite's folder in its official layout (else its LMFORGE_*_DIR variable)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per forward pass (default 32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.set_defaults(func=_evaluate)
