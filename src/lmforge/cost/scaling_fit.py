"""Fit Chinchilla's scaling law to a sweep's final losses, with both of Hoffmann et al.'s (2022) methods.

Input rows are ``{"n": non-embedding parameters, "d": training tokens, "c": FLOPs (default 6·n·d), "loss":
final loss}``, optionally with ``"budget"``, the compute budget the row's cell was planned for (rows of one
IsoFLOP profile share it; without it rows are grouped by C to two significant digits).

Approach 2 (IsoFLOP profiles). For each budget C, fit a parabola to loss against log N; its vertex is the
compute-optimal size N_opt(C). A vertex outside the sizes measured is flagged (``inside: false``): the profile
is not a parabola over that range, or the sizes do not bracket the optimum; each budget also records its best
measured size (``n_best``, ``loss_best``). A line through the log N_opt against log C gives N_opt ∝ C^a, and with
D_opt = C / (6 N_opt), D_opt ∝ C^b.

Approach 3 (parametric). Fit L(N, D) = E + A/N^α + B/D^β by minimising the Huber loss (δ = 1e-3) of
``log L̂ - log L``, with ``log L̂ = LSE(a - α log N, b - β log D, e)`` (A = e^a, B = e^b, E = e^e), by L-BFGS
from a grid of starts, keeping the best: the paper's procedure (which ran L-BFGS from all 4,500 points of
its grid; here every point is scored and L-BFGS runs from the 32 best). Its allocation exponents are
a = β/(α+β) and b = α/(α+β).

Confidence intervals: the 2.5th and 97.5th percentiles of the same fits on bootstrap resamples of the rows
(approach 3 restarts each resample from the full fit's optimum).

Example:
    >>> import numpy as np
    >>> rows = [{"n": n, "d": 1e17 / (6 * n), "c": 1e17, "loss": 2 + 500 / n**0.35 + 600 / (1e17 / (6 * n))**0.3}
    ...         for n in (1e6, 3e6, 1e7, 3e7, 1e8)]
    >>> fit = approach2(rows)
    >>> len(fit["budgets"]), bool(1e6 < fit["budgets"][0]["n_opt"] < 1e8), fit["budgets"][0]["inside"]
    (1, True, True)
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any

import numpy as np

from lmforge.cost.chinchilla import ScalingLaw
from lmforge.errors import UserInputError

HUBER_DELTA = 1e-3
# The paper's grid of starts: alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}.
PAPER_GRID = {"alpha": np.arange(0.0, 2.01, 0.5), "beta": np.arange(0.0, 2.01, 0.5),
              "e": np.arange(-1.0, 1.01, 0.5), "a": np.arange(0.0, 25.1, 5.0), "b": np.arange(0.0, 25.1, 5.0)}
MIN_SIZES = 3


def budget_of(row: dict[str, Any]) -> float:
    """The row's IsoFLOP budget: its ``budget``, else its FLOPs to two significant digits."""
    if row.get("budget"):
        return float(row["budget"])
    c = float(row["c"])
    return float(f"{c:.1e}")


def check_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with n, d, loss > 0 and c filled in (6·n·d when absent); anything else is refused, naming the row."""
    if not rows:
        raise UserInputError("no results to fit: the folder holds no rows with n, d and loss")
    out = []
    for i, row in enumerate(rows):
        for key in ("n", "d", "loss"):
            value = row.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise UserInputError(f"result row {i + 1}: {key}={value!r} must be a positive number")
        out.append({**row, "c": float(row.get("c") or 6 * row["n"] * row["d"])})
    return out


def group_by_budget(rows: list[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    """IsoFLOP profiles: the rows of each budget; fewer than 3 sizes in any budget is refused with the counts."""
    groups: dict[float, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(budget_of(row), []).append(row)
    sizes = {c: len({r["n"] for r in g}) for c, g in sorted(groups.items())}
    short = {c: k for c, k in sizes.items() if k < MIN_SIZES}
    if short:
        counts = ", ".join(f"{c:.3g} FLOPs: {k}" for c, k in sizes.items())
        raise UserInputError(f"an IsoFLOP fit needs at least {MIN_SIZES} model sizes per budget; sizes per budget "
                             f"are {counts}: add sizes to the budgets short of {MIN_SIZES}")
    return dict(sorted(groups.items()))


# ------------------------------------------------------------------------------------------ approach 2
def approach2(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Parabola vertices per budget, and the power laws N_opt ∝ C^a, D_opt ∝ C^b through them."""
    budgets = []
    for c, group in group_by_budget(check_rows(rows)).items():
        x = np.log10([r["n"] for r in group])
        y = np.array([r["loss"] for r in group])
        p2, p1, p0 = np.polyfit(x, y, 2)
        if p2 <= 0:  # no minimum: the sizes do not bracket the optimum
            raise UserInputError(f"budget {c:.3g} FLOPs: loss against log N has no minimum (the parabola opens "
                                 "downwards); add sizes on both sides of the best one")
        x_opt = -p1 / (2 * p2)
        n_opt = 10**x_opt
        best = min(group, key=lambda r: r["loss"])
        budgets.append({"c": c, "n_opt": float(n_opt), "d_opt": c / (6 * n_opt), "loss_opt": p0 - p1 * p1 / (4 * p2),
                        "tokens_per_param": c / (6 * n_opt) / n_opt, "parabola": [p2, p1, p0],
                        # a vertex outside the sizes measured is the parabola's extrapolation, not a measured optimum
                        "inside": bool(x.min() <= x_opt <= x.max()),
                        "n_best": best["n"], "d_best": best["d"], "loss_best": best["loss"]})
    result: dict[str, Any] = {"budgets": budgets}
    if len(budgets) >= 2:
        lc = np.log10([b["c"] for b in budgets])
        a, a0 = np.polyfit(lc, np.log10([b["n_opt"] for b in budgets]), 1)
        b, b0 = np.polyfit(lc, np.log10([b["d_opt"] for b in budgets]), 1)
        result.update({"a": float(a), "b": float(b), "log10_n_intercept": float(a0), "log10_d_intercept": float(b0)})
    return result


# ------------------------------------------------------------------------------------------ approach 3
def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, delta: float):
    """Huber loss of log L̂ - log L and its gradient in (a, b, e, alpha, beta)."""
    a, b, e, alpha, beta = theta
    u = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # (3, R)
    top = u.max(axis=0)
    w = np.exp(u - top)
    total = w.sum(axis=0)
    r = top + np.log(total) - log_l  # (R,)
    w /= total  # softmax weights: d LSE / d u
    small = np.abs(r) <= delta
    loss = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta)).sum()
    g = np.where(small, r, delta * np.sign(r))  # (R,)
    grad = np.array([(g * w[0]).sum(), (g * w[1]).sum(), (g * w[2]).sum(),
                     -(g * w[0] * log_n).sum(), -(g * w[1] * log_d).sum()])
    return loss, grad


def _minimise(start, data, delta):
    from scipy.optimize import minimize

    return minimize(_objective, np.asarray(start, dtype=float), args=(*data, delta), jac=True, method="L-BFGS-B")


def _one_blas_thread():
    """Five parameters: threaded BLAS inside L-BFGS only waits on its threads (many times slower on a busy host).
    scipy is imported first: a limit covers only the libraries loaded when it is set."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise UserInputError("scaling fits need scipy: pip install 'lmforge[scaling]'") from None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1)


def approach3(rows: list[dict[str, Any]], grid: dict[str, Any] | None = None, delta: float = HUBER_DELTA,
              start: np.ndarray | None = None, refine: int = 32) -> dict[str, Any]:
    """L(N, D) = E + A/N^alpha + B/D^beta by Huber/L-BFGS from the ``refine`` best starts of ``grid`` (default:
    the paper's 4,500), or from ``start`` only (a, b, e, alpha, beta)."""
    rows = check_rows(rows)
    data = (np.log([r["n"] for r in rows]), np.log([r["d"] for r in rows]), np.log([r["loss"] for r in rows]))
    if start is not None:
        starts = [start]
    else:
        g = grid or PAPER_GRID
        starts = [(a, b, e, al, be) for a, b, e, al, be in itertools.product(g["a"], g["b"], g["e"], g["alpha"],
                                                                           g["beta"])]
        # Every start is scored first (cheap); L-BFGS runs from the best `refine` of them.
        scores = [_objective(np.asarray(s, dtype=float), *data, delta)[0] for s in starts]
        starts = [starts[i] for i in np.argsort(scores)[:refine]]
    with _one_blas_thread():
        best = min((_minimise(s, data, delta) for s in starts), key=lambda res: res.fun)
    a, b, e, alpha, beta = (float(v) for v in best.x)
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta,
            "a": beta / (alpha + beta), "b": alpha / (alpha + beta), "huber_loss": float(best.fun),
            "theta": [a, b, e, alpha, beta]}


# ------------------------------------------------------------------------------------------ both, with CIs
def fit(rows: list[dict[str, Any]], bootstrap: int = 100, seed: int = 0, grid: dict[str, Any] | None = None,
        delta: float = HUBER_DELTA) -> dict[str, Any]:
    """Approaches 2 and 3 with bootstrap 95% intervals, tokens per parameter, and the fitted law as a plan."""
    rows = check_rows(rows)
    two = approach2(rows)
    three = approach3(rows, grid, delta)
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {}
    for _ in range(bootstrap):
        resample = [rows[i] for i in rng.integers(0, len(rows), len(rows))]
        fitted = approach3(resample, delta=delta, start=np.array(three["theta"]))
        for key in ("E", "A", "B", "alpha", "beta", "a", "b"):
            samples.setdefault(f"approach3.{key}", []).append(fitted[key])
        try:
            again = approach2(resample)
        except UserInputError:  # a resample that lost a budget's third size says nothing about a and b
            continue
        for key in ("a", "b"):
            if key in again:
                samples.setdefault(f"approach2.{key}", []).append(again[key])
    intervals = {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in samples.items()}
    law = ScalingLaw(three["E"], three["A"], three["B"], three["alpha"], three["beta"],
                     source="lmforge scaling fit: loss from approach 3" + (
                         "; allocation from approach 2" if "a" in two else ""))
    if "a" in two:
        c_mid = float(np.median([b["c"] for b in two["budgets"]]))
        law.a, law.b = two["a"], two["b"]
        law.anchor = (c_mid, 10 ** (two["log10_n_intercept"] + two["a"] * math.log10(c_mid)))
    return {"approach2": two, "approach3": {k: v for k, v in three.items() if k != "theta"},
            "intervals": intervals, "bootstrap": bootstrap, "rows": len(rows),
            "tokens_per_param": [{"c": b["c"], "ratio": b["tokens_per_param"]} for b in two["budgets"]],
            "law": law.to_dict()}
