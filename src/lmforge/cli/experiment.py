"""``lmforge experiment``: run a grid of pre-training / fine-tuning / prompting runs and report it as a table with
error bars.

``run GRID.yaml --out DIR`` runs every cell x seed of the grid (see :mod:`lmforge.experiments.grid` for the file)
into ``DIR/cells/<cell>/seed-<s>/``, each in a child process, then writes ``DIR/results.jsonl``, ``table.md``,
``table.csv``, ``plots/`` and ``report.html``. Rerunning the same command skips finished cells and resumes an
interrupted one from its checkpoint. ``report DIR`` rewrites the report from the results. ``docs [GRID ...]``
regenerates the documentation's measured tables (:mod:`lmforge.experiments.docs_tables`).

Example::

    $ lmforge experiment run experiments/positions.yaml --size small --out exp/positions --dry-run
    $ lmforge experiment run experiments/positions.yaml --size small --out exp/positions --workers 2
    $ lmforge experiment run experiments/positions.yaml --size small --out exp/positions --retry-failed
    $ lmforge experiment run grid.yaml --out exp/g --backend ray --address ray://head:10001
    $ lmforge experiment report exp/positions
    $ lmforge experiment docs experiments/positions.yaml --size small --runs-dir exp --workers 2
    $ lmforge experiment docs --check
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmforge.cli.main import plain_warnings
from lmforge.errors import UserInputError
from lmforge.experiments import docs_tables, load_grid, report, run_grid
from lmforge.experiments.backends import BACKENDS
from lmforge.experiments.runner import machine_fault
from lmforge.experiments.report import TABLE_FILE
from lmforge.utils.folder_kinds import require_kind


def _log(line: str) -> None:
    print(f"lmforge experiment: {line}", file=sys.stderr, flush=True)


def run(args) -> int:
    with plain_warnings("experiment"):
        if args.dry_run:
            print(load_grid(args.grid, args.size).listing())
            return 0
        result = run_grid(args.grid, args.out, size=args.size, workers=args.workers, threads=args.threads,
                          backend=args.backend, address=args.address, retry_failed=args.retry_failed,
                          extend=args.extend, log=_log)
    print((result.out / TABLE_FILE).read_text(encoding="utf-8"), end="")
    _log(f"{result.ok} run(s) finished, {result.failed} failed, {result.skipped} already done, "
         f"{result.interrupted} interrupted; report: {result.out / 'report.html'}")
    if result.interrupted:
        return 130
    fault = machine_fault(result.out)
    if fault is not None:  # a full disk is the machine's, not a cell's bug: exit 3, one line naming the file
        raise fault
    return 1 if any(e["failed"] for e in result.table) else 0


def run_report(args) -> int:
    require_kind(args.dir, ("experiment",), "experiment report", "DIR")
    report(args.dir)
    print((Path(args.dir) / TABLE_FILE).read_text(encoding="utf-8"), end="")
    return 0


def run_docs(args) -> int:
    root = Path.cwd()
    manifest = root / docs_tables.TABLES_DIR / docs_tables.MANIFEST
    if (args.check or not args.grids) and not manifest.is_file():
        raise UserInputError(f"{manifest}: no such manifest; run from the repository root"
                             + ("" if args.check else ", or name the grids to run"))
    if args.check:
        problems = docs_tables.check_tables(root)
        for line in problems:
            print(line)
        _log(f"{len(problems)} stale or missing table(s)" if problems else "every table is current")
        return 1 if problems else 0
    if args.grids:
        jobs = [(grid, args.size) for grid in args.grids]
    else:
        entries = docs_tables.read_manifest(manifest)
        jobs = [(e["grid"], e["size"]) for e in entries if args.size is None or e["size"] == args.size]
        if not jobs:
            raise UserInputError("no GRID given and no table in docs/lab/experiments/tables.json"
                                 f"{' at --size ' + args.size if args.size else ''}; name the grids to run")
    shipped = 0
    with plain_warnings("experiment"):
        for grid, size in jobs:
            command = " ".join(["lmforge experiment docs", grid, *(["--size", size] if size else []),
                                "--runs-dir", args.runs_dir, "--workers", str(args.workers),
                                *(["--threads", str(args.threads)] if args.threads else [])])
            shipped += len(docs_tables.regenerate([grid], size, args.runs_dir, root=root, workers=args.workers,
                                                  threads=args.threads, command=command, log=_log))
    _log(f"{shipped} of {len(jobs)} table(s) regenerated")
    return 0 if shipped == len(jobs) else 1  # a grid with a failed run keeps its old table


def add_runner_arguments(parser) -> None:
    """The options of where and how the cells run (``experiment run`` and ``scaling sweep``)."""
    parser.add_argument("--workers", type=int, default=1, help="cells run at once as local processes (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per cell (default: cores // workers, at least 1; ray: the cell's num_cpus)")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="local child processes, or Ray tasks with the grid's per-cell resources "
                             "(pip install 'lmforge[ray]')")
    parser.add_argument("--address", default=None,
                        help="ray: the cluster to connect to (e.g. ray://head:10001 or auto); default: a local one")
    parser.add_argument("--retry-failed", action="store_true", help="run the cells that failed again (from their "
                                                                    "checkpoints)")


def register(subparsers) -> None:
    parser = subparsers.add_parser("experiment", help="run a grid of runs (axes x seeds) and report it as a table")
    sub = parser.add_subparsers(dest="experiment_command", metavar="SUBCOMMAND")
    go = sub.add_parser(
        "run", help="run every cell x seed of a grid file into a folder, then write its report",
        description="Run the grid's cells (the cross product of its axes) for each seed, each cell an ordinary "
                    "lmforge run folder under OUT/cells/, each in a child process. Exit code 1 when a cell failed "
                    "(it is recorded with its error; the others still run).")
    go.add_argument("grid", metavar="GRID.yaml", help="the grid file (command, settings, axes, seeds, budget, "
                                                      "metrics, finetune, resources, sizes)")
    go.add_argument("--out", metavar="DIR", required=False, default=None,
                    help="experiment folder (required unless --dry-run)")
    go.add_argument("--size", default=None, help="apply one of the grid's sizes (e.g. small)")
    add_runner_arguments(go)
    go.add_argument("--extend", action="store_true",
                    help="accept a changed grid that only adds cells or seeds (existing cells may not change)")
    go.add_argument("--dry-run", action="store_true", help="check the grid and list its cells; run nothing")
    go.set_defaults(func=_checked_run)
    rep = sub.add_parser("report", help="rewrite table.md, table.csv, plots/ and report.html from results.jsonl",
                         description="Rewrite an experiment folder's report from its results.jsonl, judging the "
                                     "claims: of its copy of the grid, DIR/grid.yaml.")
    rep.add_argument("dir", metavar="DIR", help="experiment folder")
    rep.set_defaults(func=run_report)
    docs = sub.add_parser(
        "docs", help="regenerate the documentation's measured tables (docs/lab/experiments/) from the grids",
        description="For each grid: prepare its data as its header says (when missing), run it (resuming a folder "
                    "already there) into RUNS_DIR/GRID/SIZE, copy its table.md with a header (command, date, "
                    "commit, machine, load, wall time) to docs/lab/experiments/GRID-SIZE.md and record its "
                    "fingerprint in docs/lab/experiments/tables.json. Without GRID: every table the manifest lists, "
                    "each at its own size. --check only reports the stale tables (exit 1 when there is one). Run "
                    "from the repository root.")
    docs.add_argument("grids", nargs="*", metavar="GRID.yaml", help="grid files (default: the manifest's)")
    docs.add_argument("--size", default=None, help="the grids' size (default: each manifest entry's; for a named "
                                                   "GRID, the grid's default size)")
    docs.add_argument("--runs-dir", metavar="DIR", default="exp",
                      help="where the experiment folders go, DIR/GRID/SIZE (default exp)")
    docs.add_argument("--workers", type=int, default=1, help="cells run at once as local processes (default 1)")
    docs.add_argument("--threads", type=int, default=None,
                      help="torch threads per cell (default: cores // workers, at least 1)")
    docs.add_argument("--check", action="store_true", help="run nothing: list the tables whose grids changed since "
                                                           "they were measured")
    docs.set_defaults(func=run_docs)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def _checked_run(args) -> int:
    if args.out is None and not args.dry_run:
        raise UserInputError("missing --out DIR (the experiment folder)")
    return run(args)
