"""``lmforge scaling``: IsoFLOP sweeps and Chinchilla fits.

Example::

    $ lmforge scaling sweep --size small --data data/austen --out sweep --workers 2   # run the cells (resumable)
    $ lmforge scaling sweep --size small --data data/austen --out sweep --dry-run    # only write sweep/sweep.yaml
    $ lmforge scaling fit sweep/                                                     # approaches 2 and 3, CIs, plots
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from lmforge.cli.experiment import add_runner_arguments
from lmforge.cli.main import plain_warnings
from lmforge.cost import scaling_fit
from lmforge.cost.chinchilla import PUBLISHED
from lmforge.cost.scaling_report import plot_frontier, plot_isoflops, read_results
from lmforge.cost.sweep import SIZES, SWEEP_FILE, budgets_of, isoflop_grid, sweep_cells
from lmforge.errors import UserInputError
from lmforge.experiments import load_grid, run_grid
from lmforge.experiments.runner import check_grid_copy, check_runner_options
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
        "sweep", help="run an IsoFLOP sweep (K budgets x M sizes, D = C/(6N)) on the experiment runner",
        description="Build an IsoFLOP sweep from a base preset: budgets spaced by --spacing, sizes centred on 20 "
                    "tokens per parameter, each trained for D = C/(6N) tokens with a cosine schedule over its own "
                    "steps. Writes OUT/sweep.yaml (a grid file of `lmforge experiment run`) and runs its cells into "
                    "OUT like `lmforge experiment run` does: rerunning the same command skips finished cells and "
                    "resumes interrupted ones. Then `lmforge scaling fit OUT`. Sizes: " + "; ".join(
                        f"{k}: {v['budgets']} budgets from {v['smallest']:g} FLOPs x{v['spacing']:g}, {v['sizes']} "
                        "sizes" for k, v in SIZES.items()))
    sweep.add_argument("--dry-run", action="store_true", help="write OUT/sweep.yaml (a grid file: "
                                                               "`lmforge experiment run` takes it too) and stop")
    sweep.add_argument("--size", choices=list(SIZES), default="small", help="preset sweep size (see above)")
    sweep.add_argument("--base", default="gpt-tiny", help="preset whose shape is scaled to each size")
    sweep.add_argument("--smallest-budget", type=float, default=None, help="smallest budget in FLOPs")
    sweep.add_argument("--spacing", type=float, default=None, help="ratio between consecutive budgets")
    sweep.add_argument("--budgets", type=int, default=None, help="number of budgets K")
    sweep.add_argument("--sizes", type=int, default=None, help="model sizes per budget M (>= 3)")
    sweep.add_argument("--batch-size", type=int, default=8, help="sequences per step of every cell")
    sweep.add_argument("--seq-len", type=int, default=64, help="sequence length of every cell")
    sweep.add_argument("--head-dim", type=int, default=16, help="attention head width of the scaled shapes")
    sweep.add_argument("--lr", type=float, default=2e-3, help="peak learning rate of every cell (cosine to 10%%)")
    sweep.add_argument("--data", default=None, help="prepared shards every cell trains on (lmforge data prepare); "
                                                    "required to run")
    sweep.add_argument("--objective", default="clm", help="pre-training objective of every cell")
    sweep.add_argument("--out", required=True, metavar="OUT", help="experiment folder of the sweep")
    add_runner_arguments(sweep)
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
    for b in two["budgets"]:
        if not b["inside"]:
            print(f"budget {b['c']:.3g}: the vertex N = {b['n_opt']:.3g} lies outside the sizes measured (an "
                  f"extrapolation, not an optimum); the best measured size: N = {b['n_best']:.3g}, "
                  f"{b['d_best'] / b['n_best']:.0f} tokens per parameter, loss {b['loss_best']:.4g}")
    print("tokens per parameter at the optimum: " + ", ".join(
        f"{t['ratio']:.1f} at {t['c']:.2g} FLOPs" for t in fitted["tokens_per_param"]) + "   (Chinchilla: ~20)")
    print(f"wrote {out / 'scaling_fit.json'}, {out / 'isoflop.png'}, {out / 'frontier.png'}")
    return 0


def run_sweep(args) -> int:
    size = SIZES[args.size]
    budgets = budgets_of(args.smallest_budget or size["smallest"], args.spacing or size["spacing"],
                         args.budgets or size["budgets"])
    if not args.lr > 0:
        raise UserInputError(f"--lr {args.lr}: must be > 0")
    check_runner_options(args.workers, args.threads, args.backend)
    if args.data is None and not args.dry_run:
        raise UserInputError("--data: give the prepared shards every cell trains on (lmforge data prepare ...)")
    settings = {"objective": args.objective, "lr": args.lr,
                **({"data": str(Path(args.data).resolve())} if args.data else {})}
    grid = isoflop_grid(args.base, budgets, args.sizes or size["sizes"], batch_size=args.batch_size,
                        seq_len=args.seq_len, head_dim=args.head_dim, settings=settings)
    out = Path(args.out)
    path = out / SWEEP_FILE
    cells = sweep_cells(grid)
    steps = sum(c["steps"] for c in cells)
    summary = (f"{len(budgets)} budgets x {len(cells) // len(budgets)} sizes = {len(cells)} cells, {steps:,} steps, "
               f"{sum(c['budget'] for c in cells):.3g} FLOPs (C = 6ND) in all")
    text = yaml.safe_dump(grid, sort_keys=False)
    with plain_warnings("scaling"):
        checked = load_grid(path, raw=yaml.safe_load(text)) if args.data else None  # before anything is written
        if args.dry_run:
            atomic_write_text(path, text)
            print(f"wrote {path}: {summary}")
            return 0
        check_grid_copy(checked, out, extend=False)  # a changed sweep is refused before sweep.yaml is replaced
        atomic_write_text(path, text)
        print(f"{path}: {summary}", file=sys.stderr, flush=True)
        result = run_grid(path, out, workers=args.workers, threads=args.threads, backend=args.backend,
                          address=args.address, retry_failed=args.retry_failed,
                          log=lambda line: print(f"lmforge scaling sweep: {line}", file=sys.stderr, flush=True))
    print(f"{result.ok} cell(s) finished, {result.failed} failed, {result.skipped} already done, {result.interrupted} "
          f"interrupted; next: lmforge scaling fit {out}")
    if result.interrupted:
        return 130
    return 1 if result.failed else 0
