"""Experiments: a lecture's comparison table as a grid file, run into a folder of run folders, measured with error bars.

    grid.py      the grid file: base command and settings, axes of variants, seeds, budget, metrics, chained
                 fine-tuning; expanded into cells whose configs are all checked before anything runs
    cell.py      one cell x seed in a child process: pre-train and/or fine-tune as ordinary runs, resumable, or
                 prompt a frozen model (`prompt generate`)
    backends.py  where cells run: N local processes, or Ray tasks with per-cell resources
    runner.py    the experiment folder: lock, grid copy (--extend), skip finished cells, results.jsonl
    report.py    table.md / table.csv (mean ± std over seeds, best cell marked), one plot per metric, report.html
    claims.py    a grid's claims: the lecture's sentences, which cells should beat which, judged in the report
    power.py     seed noise: the smallest detectable difference of two cells, verdicts, seeds needed

Example::

    $ lmforge experiment run experiments/positions.yaml --size small --out exp/positions --workers 2
    $ lmforge experiment report exp/positions

    >>> from lmforge.experiments import COMMANDS, run_grid
    >>> COMMANDS  # distill grids are not supported yet
    ('pretrain', 'finetune', 'prompt')
"""

from __future__ import annotations

from lmforge.experiments.grid import COMMANDS, Grid, GridError, load_grid
from lmforge.experiments.runner import ExperimentRun, report, run_grid

__all__ = ["COMMANDS", "ExperimentRun", "Grid", "GridError", "load_grid", "report", "run_grid"]
