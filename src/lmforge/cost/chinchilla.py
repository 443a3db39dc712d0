"""Chinchilla's scaling law (Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models").

Loss of a model of N non-embedding parameters trained on D tokens (approach 3, the parametric fit)::

    L(N, D) = E + A / N^α + B / D^β            E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28

Training costs C ≈ 6·N·D FLOPs. Minimising L under that constraint gives the compute-optimal allocation::

    N_opt(C) = G · (C/6)^a,   D_opt(C) = (C/6)^b / G,   a = β/(α+β),  b = α/(α+β),  G = (αA / (βB))^(1/(α+β))

The paper's three approaches disagree on the constants: approaches 1 and 2 (IsoFLOP envelopes) find a ≈ b ≈ 0.5
and put Chinchilla's own budget, 5.76e23 FLOPs, at 70B parameters and 1.4T tokens (20 tokens per parameter,
the model they trained); approach 3's rounded published coefficients put it at about 32B and 3T. Besiroglu et
al. (2024, "Chinchilla Scaling: A replication attempt") traced that to an under-converged fit and rounding, and
found a re-fit consistent with approaches 1 and 2. So :data:`PUBLISHED` plans with the approach-1 allocation
(a = b = 0.50 through Chinchilla's own point), and predicts losses with approach 3's L(N, D): both labelled.

Example:
    >>> law = PUBLISHED
    >>> n, d = law.optimum(5.76e23)
    >>> round(n / 1e9), round(d / 1e12, 2)
    (70, 1.37)
    >>> round(law.loss(70e9, 1.4e12), 3)
    1.937
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lmforge.errors import UserInputError

CHINCHILLA_C, CHINCHILLA_N, CHINCHILLA_D = 5.76e23, 70e9, 1.4e12


@dataclass
class ScalingLaw:
    """L(N, D) = E + A/N^alpha + B/D^beta, and an allocation N_opt = n_anchor · (C / c_anchor)^a.

    ``a``, ``b`` and the anchor default to the loss function's own optimum (approach 3); ``source`` says where
    the numbers come from."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    a: float | None = None
    b: float | None = None
    anchor: tuple[float, float] | None = None  # (C, N_opt(C)) of the allocation
    source: str = ""

    def loss(self, n: float, d: float) -> float:
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def bounded_loss(self, n: float, d: float, vocab_size: int) -> tuple[float, float | None]:
        """L(N, D) clipped to [0, ln V], and the law's raw value when it fell outside (else ``None``).

        No model's cross-entropy over V tokens is below 0 or worse than a uniform guess, ln V: a fit that says
        otherwise has been extrapolated beyond the data it was fitted on (small N or D), so its number means
        nothing there.

        Example:
            >>> PUBLISHED.bounded_loss(1.06e7, 3.7e5, 8192)[0] == math.log(8192)
            True
        """
        raw = self.loss(n, d)
        ceiling = math.log(vocab_size)
        if 0.0 <= raw <= ceiling:
            return raw, None
        return min(max(raw, 0.0), ceiling), raw

    def parametric_optimum(self, compute: float) -> tuple[float, float]:
        """N and D minimising L(N, D) subject to 6·N·D = C (the closed form above)."""
        s = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / s)
        n = g * (compute / 6) ** (self.beta / s)
        return n, compute / (6 * n)

    def optimum(self, compute: float) -> tuple[float, float]:
        """Compute-optimal N and D for ``compute`` FLOPs: the allocation when one is given, else the parametric one."""
        if compute <= 0 or not math.isfinite(compute):
            raise UserInputError(f"--compute {compute}: must be a positive number of FLOPs")
        if self.a is None or self.anchor is None:
            return self.parametric_optimum(compute)
        c0, n0 = self.anchor
        n = n0 * (compute / c0) ** self.a
        return n, compute / (6 * n)

    def compute_for_tokens(self, tokens: float) -> float | None:
        """The budget C whose compute-optimal D is ``tokens`` (None where D does not grow with C: a fit with
        a >= 1); what to plan for when the data, not the compute, is the limit.

        Example:
            >>> c = PUBLISHED.compute_for_tokens(2.88e5)
            >>> round(PUBLISHED.optimum(c)[1] / 2.88e5, 6)
            1.0
        """
        lo, hi = 0.0, 60.0  # log10 C: D_opt(C) is increasing in C whenever a < 1, so bisect on it
        d_lo, d_hi = self.optimum(10**lo)[1], self.optimum(10**hi)[1]
        if not (d_lo <= tokens <= d_hi):
            return None
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.optimum(10**mid)[1] < tokens else (lo, mid)
        return 10 ** ((lo + hi) / 2)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScalingLaw":
        anchor = data.get("anchor")
        return cls(**{**data, "anchor": tuple(anchor) if anchor else None})


PUBLISHED = ScalingLaw(
    E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28, a=0.50, b=0.50, anchor=(CHINCHILLA_C, CHINCHILLA_N),
    source="Hoffmann et al. 2022 (Chinchilla), published: allocation from approach 1 (a = b = 0.50 through "
           "5.76e23 FLOPs -> 70B parameters, 1.4T tokens); loss from approach 3 (E=1.69, A=406.4, B=410.7, "
           "alpha=0.34, beta=0.28)")
