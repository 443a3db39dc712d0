"""Figures drawn without pyplot: a :class:`matplotlib.figure.Figure` on the Agg canvas, and its PNG bytes.

pyplot keeps global state (the current figure, the backend); a library that draws from inside a user's process
must not switch their backend or leave figures open, so every lmforge plot is a bare Figure on its own canvas.
matplotlib is imported when a figure is first made: most commands never draw one.

Example:
    >>> fig = figure(3, 2)
    >>> _ = fig.add_subplot().plot([0, 1], [1, 0])
    >>> png(fig)[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

import io


def figure(width: float, height: float, dpi: int = 100):
    """A ``width`` x ``height`` inch Figure on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png(fig, tight: bool = False) -> bytes:
    """``fig`` as PNG bytes (laid out tightly first with ``tight``), ready for an atomic write."""
    if tight:
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
