"""How far a run's curve drifts from the law beyond its data, measured on the run itself.

A half-run prediction extrapolates the law twice as far in compute as the data reach. On runs
that follow it the law's bootstrap and profile intervals hold; on real runs they do not: fitted
on the first half, published RL curves and our own runs ended above the interval more often than
not (`bench/calibration.py --external --kept`: 6 of 10 inside, every miss an underprediction).
Early curves that have not bent are steeper than the law's shape lets a fit extrapolate (the
demo's rises almost linearly in compute), and no parameter of the law says how much.

So the run is asked. Rolling origins: the law is fitted again on its first k points (for up to
MAX_ORIGINS values of k, each prefix holding at least MIN_ORIGIN_POINTS trained evaluations past
its own floor), and each prefix fit's extrapolation to every later fitted point is compared with
the whole fit's curve there (the curve, not the noisy point: the whole fit is the best
estimate of where the run was). Each comparison gives an error e (whole curve minus prefix
extrapolation) at a distance d = ln(compute / the prefix's last compute). The errors are
modelled as

    e ~ N(rate * d, spread^2 * d^2)

a drift linear in log compute, whose scatter grows with the distance. `rate` and `spread` are
the restricted-maximum-likelihood values (rate in closed form for each spread; REML, because
plain maximum likelihood takes the spread of a few origins' errors to 0), `rate_se` the
standard error of the rate. A prediction at distance D beyond the data moves by rate * D, and
its interval widens, in quadrature, by z * sqrt(spread^2 + rate_se^2) * D. On a run that
follows the law the rate comes out near 0 and the widening small; on one whose early fits kept
underpredicting, the prediction moves up by what they missed.

The origins' errors are not independent (later prefixes hold the earlier ones' points), so
`rate_se` is optimistic; `spread` carries most of the widening. Measured effect on the 10
half-run backtests of the development set and six of our runs: 6 -> 10 inside, median signed
error -0.056 -> +0.011, median width 0.27 (README, "How far to trust a prediction").

The price is width on runs that do follow the law: a prefix fit holds fewer points than the
whole fit, so what it misses also counts the noise of its own parameters, which the whole fit's
band already holds. Taking each prefix's own band variance out of the errors' (the spread then
counts only what the prefixes' intervals did not expect) brought law-following intervals back
to the law's width but held 9 of the 10 ends, with a median error of +0.054: not kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize_scalar

from scalerl.errors import ScaleRLError
from scalerl.fit.problem import FloatArray

MIN_ORIGIN_POINTS = 6  # a prefix fit with fewer has too little to extrapolate from
MAX_ORIGINS = 8  # spread over the eligible prefixes: enough to see a trend, cheap to refit
# Prefix fits search a coarser grid than the main fit (the refinement then finds the same
# optimum: measured on the development set, the drift figures above are unchanged).
ORIGIN_A_STEP = 0.02
ORIGIN_C_MID_VALUES = 30
# Keeps the likelihood finite when every origin's error lies on one line. Not a noise model: a
# floor at a smooth curve's precision (one evaluation's variance over the number fitted) gave
# the small errors of the nearest extrapolations the weight of noise, and halved the coverage
# gain on the development set (10 -> 8 of 10 inside).
VARIANCE_FLOOR = 1e-8


@dataclass(frozen=True)
class Drift:
    """The run's drift from the law per unit of ln compute beyond its data."""

    rate: float  # pass rate gained over the law per unit of ln compute (actual - law)
    spread: float  # scatter of that gain per unit of ln compute
    rate_se: float
    origins: int  # prefix fits it rests on

    def shift(self, distance: ArrayLike) -> FloatArray:
        """What to add to the law's prediction `distance` (ln compute) beyond the data."""
        out: FloatArray = self.rate * np.maximum(np.asarray(distance, dtype=float), 0.0)
        return out

    def sd(self, distance: ArrayLike) -> FloatArray:
        """The standard deviation of that shift."""
        d = np.maximum(np.asarray(distance, dtype=float), 0.0)
        out: FloatArray = math.hypot(self.spread, self.rate_se) * d
        return out

    def to_dict(self) -> dict[str, float | int]:
        return {
            "rate": self.rate,
            "spread": self.spread,
            "rateSe": self.rate_se,
            "origins": self.origins,
        }


@dataclass(frozen=True)
class DriftInputs:
    """What a fit was made from, kept so its drift can be measured when first asked for (it
    costs a handful of refits, and most fits are never asked to extrapolate)."""

    compute: FloatArray
    pass_rate: FloatArray
    sigma: FloatArray | None
    r0: str | float
    min_compute: float | None  # the caller's option: None means each prefix's own default


# The fitter's own functions, handed in by it (this module cannot import the fitter, which
# imports it): fit_curve, and compute_floor (the compute below which a fit leaves points out).
Refit = Callable[..., Any]
Floor = Callable[[float, float | None], float]


def measure(inputs: DriftInputs, curve: FloatArray, *, refit: Refit, floor: Floor) -> Drift | None:
    """The drift of the run in `inputs` from the law fitted to all of it (`curve`: that fit's
    values at each input compute). None with fewer than two usable origins."""
    c, y, se = inputs.compute, inputs.pass_rate, inputs.sigma
    distances, errors, origins = [], [], 0
    for k in _origins(c, inputs.min_compute, floor):
        head = slice(0, k + 1)
        positive = c[head][c[head] > 0]
        try:
            early = refit(
                c[head],
                y[head],
                sigma=None if se is None else se[head],
                r0=inputs.r0,
                min_compute=inputs.min_compute,
                bootstrap=0,
                a_grid=np.round(np.arange(0.0, 1.0 + 1e-9, ORIGIN_A_STEP), 3),
                c_mid_grid=np.geomspace(
                    positive[0] / 10.0, 100.0 * positive[-1], ORIGIN_C_MID_VALUES
                ),
            )
        except ScaleRLError:
            continue
        later = np.arange(k + 1, c.size)
        later = later[c[later] > c[k]]
        if later.size == 0:
            continue
        origins += 1
        distances.append(np.log(c[later] / c[k]))
        errors.append(curve[later] - early.predict(c[later]))
    if origins < 2:
        return None
    return _fit_drift(np.concatenate(distances), np.concatenate(errors), origins)


def _origins(c: FloatArray, min_compute: float | None, floor: Floor) -> list[int]:
    """Indices k whose prefix c[:k+1] holds MIN_ORIGIN_POINTS trained points past its own
    floor, and at least half of the points the whole fit has, and leaves a later point; at most
    MAX_ORIGINS of them, spread evenly.

    Half, as the half-run check (`scalerl.fit.backtest`) fits: a prefix of a few points before
    the bend extrapolates wildly even on a run that follows the law (on examples/curve.csv,
    origins from 6 of its 50 points made the interval 7 times the data out [0.19, 0.90]; from
    half of them, [0.49, 0.76]), and what such a fit misses says little about a fit of them all.
    """

    def trained(head: FloatArray) -> int:
        return int(((head > 0) & (head >= floor(float(head[-1]), min_compute))).sum())

    enough = max(MIN_ORIGIN_POINTS, trained(c) / 2)
    eligible = [k for k in range(c.size - 1) if c[k] < c[-1] and trained(c[: k + 1]) >= enough]
    if len(eligible) <= MAX_ORIGINS:
        return eligible
    picks = np.unique(np.round(np.linspace(0, len(eligible) - 1, MAX_ORIGINS)).astype(int))
    return [eligible[i] for i in picks]


def _fit_drift(d: FloatArray, e: FloatArray, origins: int) -> Drift:
    """Restricted maximum likelihood of e ~ N(rate d, spread^2 d^2 + VARIANCE_FLOOR): for a
    given spread the rate is the weighted least-squares slope; the spread is found on a log
    scale."""
    v = VARIANCE_FLOOR

    def rate_at(log_spread2: float) -> tuple[float, FloatArray]:
        w = 1.0 / (v + math.exp(log_spread2) * d * d)
        return float(np.sum(w * d * e) / np.sum(w * d * d)), w

    def nll(log_spread2: float) -> float:
        rate, w = rate_at(log_spread2)
        # REML: the likelihood of the errors' scatter about the rate, not knowing the rate
        # (plain maximum likelihood underestimates the spread from a few origins, to 0 on two).
        return float(
            0.5 * (np.sum(-np.log(w) + w * (e - rate * d) ** 2) + math.log(np.sum(w * d * d)))
        )

    # The likelihood can have several local optima in the spread: scan, then refine the best.
    scan = np.linspace(math.log(1e-10), 0.0, 121)
    start = int(np.argmin([nll(x) for x in scan]))
    bounds = (scan[max(start - 1, 0)], scan[min(start + 1, scan.size - 1)])
    log_spread2 = float(minimize_scalar(nll, bounds=bounds, method="bounded").x)
    rate, w = rate_at(log_spread2)
    return Drift(
        rate=rate,
        spread=math.sqrt(math.exp(log_spread2)),
        rate_se=math.sqrt(1.0 / float(np.sum(w * d * d))),
        origins=origins,
    )
