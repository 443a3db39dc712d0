"""``lmforge scaling``: IsoFLOP sweeps and Chinchilla fits.

Example::

    $ lmforge scaling sweep --dry-run --size small --out sweep/grid.json     # the grid for the experiment runner
    $ lmforge scaling fit sweep/                                            # approaches 2 and 3, CIs, plots
"""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.cost import scaling_fit
from lmforge.cost.chinchilla import PUBLISHED
from lmforge.cost.scaling_report import plot_frontier, plot_isoflops, read_results
from lmforge.cost.sweep import SIZES, budgets_of, isoflop_grid
from lmforge.errors import UserInputError
from lmforge.utils.io import atomic_write_text


def register(subparsers) -> None:
    parser = subparsers.add_parser("scaling", help="IsoFLOP sweeps and Chinchilla scaling-law fits")
    sub = parser.add_subparsers(dest="scaling_command", metavar="SUBCOMMAND")
    fit = sub.add_parser(
        "fit", help="fit Chinchilla's approaches 2 and 3 to a sweep's results",
        description="Fit approach 2 (a parabola in log N per budget: N_opt ∝ C^a, D_opt ∝ C^b) and approach 3 "
                    "(L = E + A/N^α + B/D^β by Huber loss on log L with L-BFGS from a grid of starts), with "
                    "bootstrap 95%% intervals. DIR holds results.jsonl rows (n, d, loss, optional c and budget) or "
                    "run folders. Writes DIR/scaling_fit.json (usable by `lmforge plan --fit`), "
                    "DIR/isoflop.png and DIR/frontier.png.")
    fit.add_argument("dir", metavar="DIR", help="folder of sweep results")
    fit.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples for the intervals (0: none)")
    fit.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    fit.add_argument("--out", default=None, help="folder for the fit and plots (default: DIR)")
    fit.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    fit.set_defaults(func=run_fit)
    sweep = sub.add_parser(
        "sweep", help="the IsoFLOP grid of a sweep (K budgets x M sizes, D = C/(6N))",
        description="Build an IsoFLOP sweep's grid from a base preset: budgets spaced by --spacing, sizes centred "
                    "on 20 tokens per parameter, each trained for D = C/(6N) tokens. With --dry-run, write the "
                    "grid file for the experiment runner and stop. Sizes: " + "; ".join(
                        f"{k}: {v['budgets']} budgets from {v['smallest']:g} FLOPs x{v['spacing']:g}, {v['sizes']} "
                        "sizes" for k, v in SIZES.items()))
    sweep.add_argument("--dry-run", action="store_true", help="write the grid file only (required for now: the "
                                                               "cells run on the experiment runner)")
    sweep.add_argument("--size", choices=list(SIZES), default="small", help="preset sweep size (see above)")
    sweep.add_argument("--base", default="gpt-tiny", help="preset whose shape is scaled to each size")
    sweep.add_argument("--smallest-budget", type=float, default=None, help="smallest budget in FLOPs")
    sweep.add_argument("--spacing", type=float, default=None, help="ratio between consecutive budgets")
    sweep.add_argument("--budgets", type=int, default=None, help="number of budgets K")
    sweep.add_argument("--sizes", type=int, default=None, help="model sizes per budget M (>= 3)")
    sweep.add_argument("--batch-size", type=int, default=8, help="sequences per step of every cell")
    sweep.add_argument("--seq-len", type=int, default=64, help="sequence length of every cell")
    sweep.add_argument("--head-dim", type=int, default=16, help="attention head width of the scaled shapes")
    sweep.add_argument("--data", default=None, help="prepared shards every cell trains on")
    sweep.add_argument("--objective", default="clm", help="pre-training objective of every cell")
    sweep.add_argument("--out", required=True, help="grid file to write (.json)")
    sweep.set_defaults(func=run_sweep)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def run_fit(args) -> int:
    if args.bootstrap < 0:
        raise UserInputError(f"--bootstrap {args.bootstrap}: must be >= 0")
    rows = read_results(args.dir)
    fitted = scaling_fit.fit(rows, bootstrap=args.bootstrap, seed=args.seed)
    out = Path(args.out or args.dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "scaling_fit.json", json.dumps(fitted, indent=1) + "\n")
    plot_isoflops(scaling_fit.check_rows(rows), fitted, out / "isoflop.png")
    plot_frontier(fitted, out / "frontier.png")
    if args.json:
        print(json.dumps(fitted))
        return 0
    two, three, ci = fitted["approach2"], fitted["approach3"], fitted["intervals"]

    def show(name: str, value: float, key: str) -> str:
        low, high = ci.get(key, (float("nan"), float("nan")))
        return f"{name} = {value:.3f} [{low:.3f}, {high:.3f}]"

    print(f"{fitted['rows']} runs, {len(two['budgets'])} budgets; 95% bootstrap intervals ({args.bootstrap} resamples)")
    if "a" in two:
        print("approach 2: " + show("a", two["a"], "approach2.a") + ", " + show("b", two["b"], "approach2.b")
              + "   (Chinchilla: a = 0.49, b = 0.51)")
    print("approach 3: " + ", ".join(show(k, three[k], f"approach3.{k}") for k in ("alpha", "beta", "E"))
          + f", A = {three['A']:.4g}, B = {three['B']:.4g}   (Chinchilla: α = {PUBLISHED.alpha}, β = {PUBLISHED.beta}, "
          f"E = {PUBLISHED.E})")
    print("tokens per parameter at the optimum: " + ", ".join(
        f"{t['ratio']:.1f} at {t['c']:.2g} FLOPs" for t in fitted["tokens_per_param"]) + "   (Chinchilla: ~20)")
    print(f"wrote {out / 'scaling_fit.json'}, {out / 'isoflop.png'}, {out / 'frontier.png'}")
    return 0


def run_sweep(args) -> int:
    if not args.dry_run:
        raise UserInputError("scaling sweep runs its cells on the experiment runner; for now pass --dry-run to "
                             "write the grid file")
    size = SIZES[args.size]
    budgets = budgets_of(args.smallest_budget or size["smallest"], args.spacing or size["spacing"],
                         args.budgets or size["budgets"])
    settings = {"objective": args.objective, **({"data": args.data} if args.data else {})}
    grid = isoflop_grid(args.base, budgets, args.sizes or size["sizes"], batch_size=args.batch_size,
                        seq_len=args.seq_len, head_dim=args.head_dim, settings=settings)
    atomic_write_text(args.out, json.dumps(grid, indent=1) + "\n")
    steps = sum(c["max_steps"] for c in grid["cells"])
    print(f"wrote {args.out}: {len(budgets)} budgets x {len(grid['cells']) // len(budgets)} sizes = "
          f"{len(grid['cells'])} cells, {steps:,} steps in all")
    return 0
