"""Learning-rate schedules as pure functions of the step: the LR of update ``s`` is ``lr * schedule(s)``.

Because the factor depends on nothing but ``s`` and the settings, a resumed run continues the curve
exactly where it stopped: there is no scheduler state to drift. ``s`` counts optimizer updates from 1 to
``max_steps``.

    name                shape of the factor (W = warmup, T = max_steps, m = min_lr_ratio)
    constant            s/W during warmup, then 1
    linear              s/W, then a straight line from 1 at s=W down to m at s=T           (BERT)
    cosine              s/W, then m + (1-m)(1 + cos(pi (s-W)/(T-W)))/2, reaching m at s=T   (GPT-3, Llama)
    inverse-sqrt        s/W, then sqrt(W/s): equals 1 at s=W, never reaches 0      (Vaswani et al. 2017)
    slanted-triangular  ULMFiT (Howard & Ruder 2018, eq. 3): a short linear rise over cut = floor(T cut_frac)
                        steps to 1, then a long linear fall to 1/ratio at s=T

``inverse-sqrt`` is Vaswani et al.'s "Noam" rate (§5.3), lr = d_model^-0.5 min(s^-0.5, s W^-1.5), once the
peak ``lr`` is :func:`noam_lr` = d_model^-0.5 W^-0.5: for s <= W that is d_model^-0.5 W^-0.5 s/W =
d_model^-0.5 s W^-1.5, and after it d_model^-0.5 W^-0.5 sqrt(W/s) = d_model^-0.5 s^-0.5.

Slanted triangular, from the paper: ``p = s/cut`` if ``s < cut`` else
``1 - (s - cut) / (cut (1/cut_frac - 1))``, and the factor is ``(1 + p (ratio - 1)) / ratio``.

Example:
    >>> sched = Schedule("linear", max_steps=100, warmup=10)
    >>> [round(sched(s), 3) for s in (1, 10, 55, 100)]
    [0.1, 1.0, 0.5, 0.0]
    >>> stlr = Schedule("slanted-triangular", max_steps=1000, cut_frac=0.1, ratio=32)
    >>> stlr.cut, stlr(100), stlr(1000) == 1 / 32
    (100, 1.0, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lmforge.training.config import SCHEDULES


def noam_lr(d_model: int, warmup: int) -> float:
    """The peak LR that turns ``inverse-sqrt`` into Vaswani et al.'s schedule: d_model^-0.5 * warmup^-0.5.

    Example:
        >>> round(noam_lr(512, 4000), 6)  # the base Transformer's peak, reached at step 4000
        0.000699
    """
    return d_model**-0.5 * warmup**-0.5


@dataclass(frozen=True)
class Schedule:
    """An LR multiplier ``schedule(step) -> float`` (see the module docstring for the shapes).

    Args:
        name: one of :data:`lmforge.training.config.SCHEDULES`.
        max_steps: T, the last update of the run.
        warmup: W, steps of linear warmup (not used by slanted-triangular, whose rise is ``cut``).
        min_ratio: end of the linear/cosine decay, as a share of the peak.
        cut_frac, ratio: slanted triangular's rise fraction and peak/floor ratio.
    """

    name: str
    max_steps: int
    warmup: int = 0
    min_ratio: float = 0.0
    cut_frac: float = 0.1
    ratio: float = 32.0

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.name!r}; choose one of {', '.join(SCHEDULES)}")

    @property
    def cut(self) -> int:
        """Slanted triangular: the step at which the rise ends (the peak)."""
        return max(1, math.floor(self.max_steps * self.cut_frac))

    def __call__(self, step: int) -> float:
        s = min(max(step, 1), self.max_steps)  # past T (a run extended on resume) the curve stays flat
        if self.name == "slanted-triangular":
            cut = self.cut
            p = s / cut if s < cut else 1 - (s - cut) / (cut * (1 / self.cut_frac - 1))
            return (1 + max(p, 0.0) * (self.ratio - 1)) / self.ratio
        W = self.warmup
        if s <= W:
            return s / W
        if self.name == "constant":
            return 1.0
        if self.name == "inverse-sqrt":
            return math.sqrt(max(W, 1) / s)
        progress = (s - W) / max(self.max_steps - W, 1)  # 0 right after warmup, 1 at s = T
        if self.name == "linear":
            return 1.0 - (1.0 - self.min_ratio) * progress
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        """The settings (the schedule has no other state): stored in checkpoints for the record."""
        return asdict(self)

    @classmethod
    def from_config(cls, config) -> "Schedule":
        """From a :class:`~lmforge.training.config.TrainConfig`."""
        return cls(config.schedule, config.max_steps, config.warmup, config.min_lr_ratio, config.cut_frac,
                   config.stlr_ratio)
