"""``lmforge datasets``: the demo data sets shipped in the package.

Example::

    $ lmforge datasets list
    $ lmforge data prepare --tokenizer tok/ --out data/austen "$(lmforge datasets path corpus)"
    $ lmforge datasets show rt-sentiment --split dev -n 2
"""

from __future__ import annotations

import json

from lmforge import datasets
from lmforge.cli.tokenizer import HELP


def _mb(n: int) -> str:
    # a few kilobytes would read "0.0 MB", which says nothing
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _list(args) -> int:
    header = f"{'name':17s} {'rows (per split)':36s} {'size (gz / raw)':18s} licence"
    print(header)
    print("-" * len(header))
    for name in datasets.names():
        entry = datasets.info(name)
        rows = ", ".join(f"{s} {n:,}" for s, n in entry.rows.items())
        size = "%s / %s" % tuple(map(_mb, datasets.file_sizes(name))) if entry.shipped else "not shipped"
        print(f"{name:17s} {rows:36s} {size:18s} {entry.license}")
    print("\nProvenance and licence texts: " + str(datasets.FILES.parent / "SOURCES.md"))
    print("Public benchmarks (GLUE, SuperGLUE, SQuAD, SNLI, RACE, IMDb ...) are read by name from your own copy: "
          "`lmforge tasks list`")
    return 0


def _path(args) -> int:
    print(datasets.path(args.name, args.split, args.data_dir))
    return 0


def _show(args) -> int:
    for row in datasets.load(args.name, args.split, args.data_dir)[: args.n]:
        print(json.dumps(row, ensure_ascii=False))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("datasets", help="list and locate the demo data sets shipped with lmforge",
                                   description="Demo data sets shipped in the package (see their SOURCES.md).")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser("list", help="names, row counts, sizes and licences", formatter_class=HELP)
    p.set_defaults(func=_list)
    for verb, func, text in (("path", _path, "print the file of one split (a valid `data prepare` input)"),
                             ("show", _show, "print the first rows of one split as JSON lines")):
        p = verbs.add_parser(verb, help=text, description=text, formatter_class=HELP)
        p.add_argument("name", help="data set name (see `lmforge datasets list`)")
        p.add_argument("--split", default="train", help="train, dev or test")
        p.add_argument("--data-dir", default=None, help="folder with the files of a set that is not shipped")
        if verb == "show":
            p.add_argument("-n", type=int, default=3, help="rows to print")
        p.set_defaults(func=func)
