"""FitResult: a fitted law, its bootstrap intervals, and predictions from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scalerl.fit.law import sigmoid

Interval = tuple[float, float]
NOISE_DRAWS = 25  # evaluation-noise draws per bootstrap replicate in a predictive interval


@dataclass(frozen=True)
class FitResult:
    """The fitted law R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) and how it was obtained.

    Intervals are bootstrap percentile intervals at `level` (None when no bootstrap was run).
    `points` counts the evaluations used, `excluded` those below `min_compute`; `fit_range` is the
    compute span of the points used (predictions beyond it are extrapolations).
    `bootstrap_failed` counts the bootstrap replicates whose refit failed and were dropped: the
    intervals rest on the others (all failed: no intervals).
    """

    A: float
    B: float
    C_mid: float
    R0: float
    A_interval: Interval | None
    B_interval: Interval | None
    C_mid_interval: Interval | None
    points: int
    excluded: int
    sse: float
    min_compute: float
    r0_mode: str
    fit_range: Interval
    level: float = 0.95
    bootstrap_failed: int = 0
    # Bootstrap parameter draws (A, B, C_mid, R0) per replicate: for bands on plots and predictions.
    draws: NDArray[np.float64] = field(
        default_factory=lambda: np.empty((0, 4)), repr=False, compare=False
    )
    # The per-point standard errors the fit was weighted by (None: all points alike), for refits
    # of the same points (the comparison rule's).
    sigma: NDArray[np.float64] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(
        cls, *, params: NDArray[np.float64], draws: NDArray[np.float64], level: float, **kw: Any
    ) -> FitResult:
        """From the fitter's parameter vector (A, B, ln C_mid, R0) and its bootstrap draws."""
        draws = np.array(draws, dtype=float)
        draws.setflags(write=False)
        tail = 100.0 * (1.0 - level) / 2.0

        def interval(column: int) -> Interval | None:
            if draws.shape[0] == 0:
                return None
            lo, hi = np.percentile(draws[:, column], [tail, 100.0 - tail])
            return float(lo), float(hi)

        A, B, log_c_mid, R0 = (float(v) for v in params)
        return cls(
            A=A,
            B=B,
            C_mid=math.exp(log_c_mid),
            R0=R0,
            A_interval=interval(0),
            B_interval=interval(1),
            C_mid_interval=interval(2),
            level=level,
            draws=draws,
            **kw,
        )

    def predict(self, compute: ArrayLike) -> Any:
        """R(C) at `compute`: a float for a number, an array for an array."""
        out = sigmoid(compute, self.A, self.B, self.C_mid, self.R0)
        return float(out) if np.ndim(out) == 0 else out

    def predict_interval(
        self, compute: ArrayLike, observation_se: float = 0.0
    ) -> tuple[Any, Any] | None:
        """Bootstrap percentile band of R(C) at `compute` (None without bootstrap draws).

        With `observation_se` (the standard error of one evaluation there, e.g. the binomial
        sqrt(R (1 - R) / (prompts k)) of a mean@k), the interval is for what that evaluation
        will read, not for the curve: each replicate's curve plus evaluation noise. Where the
        fit is tight the curve's band is narrower than one evaluation's scatter, and an
        observed pass rate falls outside it far more often than the level says.
        """
        if self.draws.shape[0] == 0:
            return None
        A, B, C_mid, R0 = (self.draws[:, i] for i in range(4))
        c = np.asarray(compute, dtype=float)
        curves = sigmoid(
            c[None, ...], *(p.reshape((-1,) + (1,) * c.ndim) for p in (A, B, C_mid, R0))
        )
        if observation_se > 0.0:
            # Fixed noise draws (seed 0), NOISE_DRAWS per replicate: the same fit always gives
            # the same interval, and its percentiles rest on thousands of values.
            noise = np.random.default_rng(0).normal(
                0.0, observation_se, size=(NOISE_DRAWS, *curves.shape)
            )
            curves = (curves[None, ...] + noise).reshape(-1, *curves.shape[1:])
        tail = 100.0 * (1.0 - self.level) / 2.0
        lo, hi = np.percentile(curves, [tail, 100.0 - tail], axis=0)
        if c.ndim == 0:
            return float(lo), float(hi)
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: plain floats, intervals as [lo, hi] lists or null."""

        def pair(value: Interval | None) -> list[float] | None:
            return None if value is None else [value[0], value[1]]

        return {
            "A": self.A,
            "B": self.B,
            "C_mid": self.C_mid,
            "R0": self.R0,
            "A_interval": pair(self.A_interval),
            "B_interval": pair(self.B_interval),
            "C_mid_interval": pair(self.C_mid_interval),
            "level": self.level,
            "points": self.points,
            "excluded": self.excluded,
            "sse": self.sse,
            "min_compute": self.min_compute,
            "r0": self.r0_mode,
            "fit_range": pair(self.fit_range),
            "bootstrap": int(self.draws.shape[0]),
            "bootstrap_failed": self.bootstrap_failed,
            "weighted": self.sigma is not None,
        }
