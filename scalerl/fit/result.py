"""FitResult: a fitted law, its bootstrap intervals, and predictions from it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit
from scipy.stats import norm

from scalerl.fit.drift import Drift, logit
from scalerl.fit.law import sigmoid
from scalerl.fit.noise import ObservationNoise
from scalerl.fit.profile import Profile

Interval = tuple[float, float]

# The forecast's band beyond the data is an envelope over a grid of this step in ln compute (so
# that it never narrows with distance), up to ENVELOPE_REACH (e^40 times the data: further out
# the band stays as it is there).
ENVELOPE_STEP = 0.02
ENVELOPE_REACH = 40.0


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
    # The points bound the ceiling only from below (`scalerl.fit.profile`): A >= this.
    A_at_least: float | None = None
    # The profile's kept parameter sets (A, B, C_mid, R0): the curves the points allow.
    profile: NDArray[np.float64] = field(
        default_factory=lambda: np.empty((0, 4)), repr=False, compare=False
    )
    # One evaluation's noise at a pass rate, read from the fitted points (`scalerl.fit.noise`).
    noise: ObservationNoise | None = field(default=None, repr=False, compare=False)
    # Measures the run's drift from the law on its own points when first asked
    # (`scalerl.fit.drift`); None: a fit that does not extrapolate (no bootstrap, a fixed A).
    drift_probe: Callable[[], Drift | None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        *,
        params: NDArray[np.float64],
        draws: NDArray[np.float64],
        level: float,
        profile: Profile | None = None,
        **kw: Any,
    ) -> FitResult:
        """From the fitter's parameter vector (A, B, ln C_mid, R0), its bootstrap draws and the
        profile of A. With a profile, A's interval is the profile's (the asymptotes the points
        cannot rule out; a bootstrap from the best fit sees only the noise about it), and B's and
        C_mid's hold the bootstrap's percentiles and every value of the profile's kept curves."""
        draws = np.array(draws, dtype=float)
        draws.setflags(write=False)
        kept = np.empty((0, 4)) if profile is None else np.array(profile.kept, dtype=float)
        kept.setflags(write=False)
        tail = 100.0 * (1.0 - level) / 2.0

        def interval(column: int) -> Interval | None:
            if draws.shape[0] == 0:
                return None
            lo, hi = np.percentile(draws[:, column], [tail, 100.0 - tail])
            return float(lo), float(hi)

        A, B, log_c_mid, R0 = (float(v) for v in params)
        a_interval, b_interval, c_mid_interval = interval(0), interval(1), interval(2)
        if a_interval is not None and profile is not None:
            a_interval = profile.interval
            b_interval = _hull(b_interval, kept[:, 1])
            c_mid_interval = _hull(c_mid_interval, kept[:, 2])
        return cls(
            A=A,
            B=B,
            C_mid=math.exp(log_c_mid),
            R0=R0,
            A_interval=a_interval,
            A_at_least=None if profile is None or a_interval is None else profile.at_least,
            profile=kept,
            B_interval=b_interval,
            C_mid_interval=c_mid_interval,
            level=level,
            draws=draws,
            **kw,
        )

    def predict(self, compute: ArrayLike) -> Any:
        """R(C) at `compute`: a float for a number, an array for an array. The law itself; where
        the run will read beyond its data is `forecast`."""
        out = sigmoid(compute, self.A, self.B, self.C_mid, self.R0)
        return float(out) if np.ndim(out) == 0 else out

    @cached_property
    def drift(self) -> Drift | None:
        """The run's measured drift from the law beyond its data (`scalerl.fit.drift`), None
        when it was not or could not be measured."""
        return None if self.drift_probe is None else self.drift_probe()

    def beyond(self, compute: ArrayLike) -> Any:
        """How far `compute` lies past the last fitted compute, in ln compute (0 within it)."""
        c = np.asarray(compute, dtype=float)
        with np.errstate(divide="ignore"):
            return np.maximum(np.log(np.maximum(c, 1e-300) / self.fit_range[1]), 0.0)

    def forecast(self, compute: ArrayLike) -> Any:
        """What the run will read at `compute`: the law, its logit moved beyond the data by as
        much of the run's measured drift from it as its own history supports (`drift`,
        `Drift.weight`). Equal to `predict` within the data, without a drift, or at weight 0."""
        out = np.asarray(self.predict(compute), dtype=float)
        if self.drift is not None:
            shift = self.drift.shift(self.beyond(compute))
            out = np.where(shift != 0.0, expit(logit(out) + shift), out)
        return float(out) if out.ndim == 0 else out

    def law_interval(
        self, compute: ArrayLike, observation_se: float | ObservationNoise = 0.0
    ) -> tuple[Any, Any] | None:
        """The law's own band at `compute` (None without bootstrap draws), whatever the run's
        drift: the bootstrap's percentile band, stretched to hold every curve the profile of A
        kept (the curves the points allow; before the bend they part far more than the
        bootstrap's), with `observation_se` added as `predict_interval` adds it. Within [0, 1].
        What the rolling origins judge later points by (`scalerl.fit.drift`)."""
        parts = self._law_parts(compute)
        if parts is None:
            return None
        lo, mid, hi = parts
        lo, hi = self._widen(lo, mid, hi, observation_se)
        lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
        if np.ndim(compute) == 0:
            return float(lo), float(hi)
        return lo, hi

    def predict_interval(
        self, compute: ArrayLike, observation_se: float | ObservationNoise = 0.0
    ) -> tuple[Any, Any] | None:
        """The forecast's band at `compute` (None without bootstrap draws).

        Within the data it is the law's (`law_interval`). Beyond it the band is centred on
        `forecast` and widens, in quadrature and in logit, by the drift's own uncertainty there
        (`Drift.sd`: the mixture's), and the curve's band never shrinks with distance: each
        side's half-width is the largest the raw band had anywhere between the data's end and
        `compute` (on a fixed grid of ENVELOPE_STEP in ln compute, so every caller reads the
        same band), and where it would cross 0 or 1 it is moved inside whole rather than cut,
        so it never collapses to a point (audit F3). An evaluation's noise is then added at
        that band's ends, as within the data (near 0 or 1 an evaluation scatters less).

        With `observation_se` (one evaluation's standard error there: an ObservationNoise, whose
        error depends on the pass rate read, or a number), the interval is for what that
        evaluation will read, not for the curve: each end moves out by the evaluation's
        two-sided `level` quantile at that end's pass rate, added in quadrature to the band's
        half-width on that side.
        """
        law = self.law_interval(compute, observation_se)
        if law is None:
            return None
        c = np.asarray(compute, dtype=float)
        distance = np.asarray(self.beyond(c), dtype=float)
        if not np.any(distance > 0):
            return law
        reach = float(min(distance.max(), ENVELOPE_REACH))
        grid = np.arange(0.0, reach + ENVELOPE_STEP, ENVELOPE_STEP)
        at = self.fit_range[1] * np.exp(grid)
        parts = self._law_parts(at)
        assert parts is not None  # there are draws: law_interval above was not None
        lo, mid, hi = parts
        shift = self.drift.shift(grid) if self.drift is not None else np.zeros_like(grid)
        spread = self.drift.sd(grid) if self.drift is not None else np.zeros_like(grid)
        lo, mid, hi = _drifted(lo, mid, hi, shift, self._z * spread)
        below = np.maximum.accumulate(mid - lo)
        above = np.maximum.accumulate(hi - mid)
        d = np.minimum(distance, ENVELOPE_REACH)
        width = np.minimum(np.interp(d, grid, below) + np.interp(d, grid, above), 1.0)
        centre = np.asarray(self.forecast(c), dtype=float)
        band_lo = np.clip(centre - np.interp(d, grid, below), 0.0, 1.0 - width)
        band_hi = band_lo + width
        # One evaluation's noise at each end's pass rate, as within the data (`_widen`).
        mid = np.clip(centre, band_lo, band_hi)
        lo, hi = self._widen(band_lo, mid, band_hi, observation_se)
        out_lo = np.where(distance > 0, np.clip(lo, 0.0, 1.0), law[0])
        out_hi = np.where(distance > 0, np.clip(hi, 0.0, 1.0), law[1])
        if c.ndim == 0:
            return float(out_lo), float(out_hi)
        return out_lo, out_hi

    def _law_parts(self, compute: ArrayLike) -> tuple[Any, Any, Any] | None:
        """The law's band at `compute` before any noise: (lo, the law clipped into it, hi)."""
        if self.draws.shape[0] == 0:
            return None
        c = np.asarray(compute, dtype=float)
        tail = 100.0 * (1.0 - self.level) / 2.0
        lo, hi = np.percentile(self._curves(self.draws, c), [tail, 100.0 - tail], axis=0)
        if self.profile.shape[0]:
            allowed = self._curves(self.profile, c)
            lo, hi = np.minimum(lo, allowed.min(axis=0)), np.maximum(hi, allowed.max(axis=0))
        mid = np.clip(self.predict(c), lo, hi)
        return lo, mid, hi

    @property
    def _z(self) -> float:
        """The standard normal quantile of a two-sided interval at `level`."""
        return float(norm.ppf(0.5 + self.level / 2.0))

    def _widen(
        self, lo: Any, mid: Any, hi: Any, observation_se: float | ObservationNoise
    ) -> tuple[Any, Any]:
        """Each side's half-width about `mid`, with one evaluation's noise at that end's pass
        rate added in quadrature."""
        noise = (
            observation_se
            if isinstance(observation_se, ObservationNoise)
            else ObservationNoise.constant(float(observation_se))
        )
        z = self._z
        lo = mid - np.sqrt((mid - lo) ** 2 + (z * noise.se(lo)) ** 2)
        hi = mid + np.sqrt((hi - mid) ** 2 + (z * noise.se(hi)) ** 2)
        return lo, hi

    def forecast_model(self) -> dict[str, Any]:
        """Which model the forecast is and why: `model` (`law`, or `law+drift` where the run's
        out-of-sample history shows the law missing in one direction beyond its own intervals),
        `weight` (the drift's share, 0-1) and `evidence` (`Drift.evidence`; null where fewer
        than two prefix fits could be made: the law alone)."""
        drift = self.drift
        if drift is None:
            return {"model": "law", "weight": 0.0, "evidence": None}
        return {"model": drift.model, "weight": drift.weight, "evidence": drift.evidence()}

    def reach(self, compute: float) -> float:
        """`compute` over the last fitted compute: how far a prediction there extrapolates."""
        last = self.fit_range[1]
        return float(compute) / last if last > 0 else math.inf

    def predictive_interval(self, compute: ArrayLike) -> tuple[Any, Any] | None:
        """What an evaluation at `compute` will read: the band widened by the noise the fitted
        evaluations themselves show at that pass rate (`self.noise`)."""
        return self.predict_interval(compute, self.noise or 0.0)

    @staticmethod
    def _curves(params: NDArray[np.float64], c: NDArray[np.float64]) -> NDArray[np.float64]:
        """R(c) for each row (A, B, C_mid, R0) of `params`: shape (rows, *c.shape)."""
        shape = (-1,) + (1,) * c.ndim
        columns = (params[:, i].reshape(shape) for i in range(4))
        out: NDArray[np.float64] = sigmoid(c[None, ...], *columns)
        return out

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
            "A_atLeast": self.A_at_least,
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
            "drift": None if self.drift is None else self.drift.to_dict(),
            "forecast": self.forecast_model(),
        }


def _hull(interval: Interval | None, values: NDArray[np.float64]) -> Interval | None:
    """`interval` stretched to hold `values` (None stays None: no bootstrap, no intervals)."""
    if interval is None or values.size == 0:
        return interval
    return min(interval[0], float(values.min())), max(interval[1], float(values.max()))


def _drifted(lo: Any, mid: Any, hi: Any, shift: Any, widen: Any) -> tuple[Any, Any, Any]:
    """The law's band (lo, mid, hi) moved by the drift's `shift` and widened in quadrature by
    `widen` on each side, both in logit (`scalerl.fit.drift`), back in pass rates; unchanged
    where there is neither (the logit would move a band's end at 0 or 1 to LOGIT_EDGE)."""
    at = logit(mid)
    centre = at + shift
    low = centre - np.sqrt((at - logit(lo)) ** 2 + widen**2)
    high = centre + np.sqrt((logit(hi) - at) ** 2 + widen**2)
    moved = (shift != 0.0) | (widen != 0.0)
    return (
        np.where(moved, expit(low), lo),
        np.where(moved, expit(centre), mid),
        np.where(moved, expit(high), hi),
    )
