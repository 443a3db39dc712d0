"""The report's figures, drawn with matplotlib's Agg canvas into PNG bytes (no pyplot, no display needed).

Each function takes stage records (see the stage modules) and returns PNG bytes, or None when the records
hold nothing to draw (a skipped stage). Nothing here computes a number: every value comes from a record.

Example:
    >>> png = bars({"a": 0.5, "b": 0.75}, "accuracy", "demo")
    >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

from typing import Any

from lmforge.utils.figures import figure, png

COLORS = ["#3b6ea8", "#d1773a", "#4f9a5a", "#b34a62", "#7b64a8", "#8a8a8a"]


def _figure(width: float, height: float):
    return figure(width, height, dpi=110)


def _png(fig) -> bytes:
    return png(fig, tight=True)


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points (training loss is noisy at batch 8)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_curves(curves: dict[str, dict[str, list]], title: str, columns: int = 3) -> bytes | None:
    """One panel per run: training loss (raw and smoothed) and held-out loss against the step."""
    curves = {k: c for k, c in curves.items() if c and c.get("loss")}
    if not curves:
        return None
    rows = -(-len(curves) // columns)
    fig = _figure(4.0 * min(columns, len(curves)), 3.2 * rows)
    for i, (name, c) in enumerate(curves.items()):
        ax = fig.add_subplot(rows, min(columns, len(curves)), i + 1)
        ax.plot(c["step"], c["loss"], color=COLORS[0], alpha=0.25, linewidth=0.8)
        ax.plot(c["step"], _smooth(c["loss"], max(1, len(c["loss"]) // 20)), color=COLORS[0], label="train")
        if c.get("eval_loss"):
            ax.plot(c["eval_step"], c["eval_loss"], "o-", color=COLORS[1], markersize=4, label="held-out")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return _png(fig)


def overlaid_curves(curves: dict[str, dict[str, list]], title: str) -> bytes | None:
    """Several runs' smoothed training loss on one axis (fine-tuning: who learns faster from where)."""
    curves = {k: c for k, c in curves.items() if c and c.get("loss")}
    if not curves:
        return None
    fig = _figure(7.5, 3.6)
    ax = fig.add_subplot()
    for i, (name, c) in enumerate(curves.items()):
        ax.plot(c["step"], _smooth(c["loss"], max(1, len(c["loss"]) // 15)), color=COLORS[i % len(COLORS)], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (smoothed)")
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def bars(values: dict[str, float], ylabel: str, title: str, baseline: float | None = None,
         baseline_label: str = "majority class", limits: tuple[float, float] | None = None) -> bytes | None:
    """A labelled bar per entry, with an optional dashed baseline."""
    values = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    if not values:
        return None
    fig = _figure(max(4.5, 1.6 * len(values) + 1.5), 3.6)
    ax = fig.add_subplot()
    names = list(values)
    drawn = ax.bar(range(len(names)), [values[n] for n in names], color=[COLORS[i % len(COLORS)] for i in
                                                                          range(len(names))])
    ax.bar_label(drawn, fmt="%.3f", fontsize=9)
    ax.set_xticks(range(len(names)), [n.replace(", ", ",\n").replace(" (", "\n(") for n in names], fontsize=8)
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label=f"{baseline_label} {baseline:.3f}")
        ax.legend(fontsize=8, loc="lower right")
    if limits:
        ax.set_ylim(*limits)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def peft_comparison(full: dict[str, Any], lora: dict[str, Any]) -> bytes | None:
    """Full fine-tuning vs LoRA: test accuracy, and the share of parameters each trains (log scale)."""
    runs = {"full fine-tuning": full, "LoRA": lora}
    if any(not r or "test" not in r for r in runs.values()):
        return None
    fig = _figure(8.0, 3.4)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = list(runs)
    acc = ax1.bar(names, [runs[n]["test"]["accuracy"] for n in names], color=COLORS[:2])
    ax1.bar_label(acc, fmt="%.3f", fontsize=9)
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("test accuracy")
    ax1.set_title("accuracy", fontsize=10)
    share = [runs[n].get("trainable_percent") or 0.0 for n in names]
    drawn = ax2.bar(names, share, color=COLORS[:2])
    ax2.bar_label(drawn, labels=[f"{s:.2f}%" for s in share], fontsize=9)
    ax2.set_yscale("log")
    ax2.set_ylabel("trainable parameters (%)")
    ax2.set_title("what trains", fontsize=10)
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("bert-tiny on rt-sentiment: full fine-tuning vs LoRA", fontsize=11)
    return _png(fig)


def probing(layers: dict[str, list[float]], baseline: float | None) -> bytes | None:
    """Probe accuracy against the layer, one line per encoder."""
    if not layers:
        return None
    fig = _figure(7.0, 3.8)
    ax = fig.add_subplot()
    for i, (name, acc) in enumerate(layers.items()):
        ax.plot(range(len(acc)), acc, "o-", color=COLORS[i % len(COLORS)], label=name, markersize=4)
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label=f"majority class {baseline:.3f}")
    ax.set_xlabel("layer (0 = token embeddings)")
    ax.set_ylabel("probe test accuracy")
    ax.set_title("linear probe of sentiment per layer (mean-pooled, frozen)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def timings(planned: dict[str, float], actual: dict[str, float]) -> bytes | None:
    """Each stage's share of the budget against the seconds it took."""
    names = [n for n in actual if n in planned]
    if not names:
        return None
    fig = _figure(7.5, 0.32 * len(names) + 1.4)
    ax = fig.add_subplot()
    y = list(range(len(names)))
    ax.barh([v + 0.2 for v in y], [planned[n] for n in names], height=0.4, color=COLORS[5], label="budget share")
    ax.barh([v - 0.2 for v in y], [actual[n] for n in names], height=0.4, color=COLORS[0], label="took")
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("time per stage", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)
