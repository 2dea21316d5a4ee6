"""How far a run's curve drifts from the law beyond its data, measured on the run itself, and how
much of that drift its own history says to believe.

A half-run prediction extrapolates the law twice as far in compute as the data reach. On runs
that follow it the law's bootstrap and profile intervals hold; on real runs they sometimes do
not: fitted on the first half, published RL curves and our own runs ended above the interval
more often than 2.5 % (the demo's curve rises almost linearly in compute, JustRL's rises late),
and no parameter of the law says how much.

So the run is asked. Rolling origins: the law is fitted again on its first k points (for up to
MAX_ORIGINS values of k, each prefix holding at least MIN_ORIGIN_POINTS trained evaluations past
its own floor, and half of the whole fit's), with intervals of its own. Each prefix fit is then
judged at every later evaluation twice:

- **the drift**: its extrapolation against the whole fit's curve there (the curve, not the
  noisy point: the whole fit is the best estimate of where the run was), in the logit of the
  pass rate. Each comparison gives an error e = logit(whole fit) - logit(prefix fit) at a
  distance d = ln(compute / the prefix's last compute), modelled as
  e ~ N(rate * d, spread^2 * d^2): a drift linear in log compute, whose scatter grows with the
  distance; `rate` and `spread` are their restricted-maximum-likelihood values (REML: plain
  maximum likelihood takes the spread of a few origins' errors to 0), `rate_se` the rate's
  standard error.
- **the evidence**: whether the later evaluation lies within the prefix fit's *own* 95 %
  predictive interval for it (`FitResult.law_interval`), above it or below it. On a run that
  follows the law about 2.5 % of them lie outside on each side; a curve that keeps leaving the
  law in one direction puts many more outside on that side. (The errors above cannot tell the
  two apart: a prefix fitted before the bend misses by a lot on a run that follows the law too,
  and its own interval, which spans every ceiling its points allow, says so.)

The evidence is taken from the latest half of the origins (RECENT_ORIGINS), the prefix fits
nearest the fit being extrapolated: early prefixes that missed where later ones no longer do
show the law converging as more of the bend is seen, not the run leaving it (on Table 1's
8B row, seed 0, the first four prefixes put 26 of 66 later evaluations above their intervals,
the last four none of 22), while a run that keeps leaving the law shows it in its latest fits
too (JustRL's first half: the last four put 9 of 56 above, 1 below).

Why the logit: a pass rate is bounded, and a drift linear in the pass rate itself carried
forecasts near the ceiling to 1.000 and their bands to [x, 1.000] (the development set's
Qwen3-14B GSM8K half-run: 1.000 [0.850, 1.000] against 0.938 read; our demo's runs at twice
their budget: 1.000 [0.592, 1.000] against 0.972). In the logit the same drift slows as the
pass rate nears 1 (0.969 [0.931, 0.987] and 0.973 [0.898, 1.000]), as runs do; near 0.5, where
the logit is almost straight, the two agree (Table 1's rows, at 0.55-0.70, read the same).

`Drift.weight` turns the evidence into how much of the drift the forecast takes: the share of
the comparisons outside on the drift's side, less the share outside on the other side (what
noise puts outside falls on both), beyond CHANCE_SHARE, scaled to 1 at FULL_SHARE; 0 when the
misses' side disagrees with the rate's sign. The forecast is then a mixture of the two models
with that weight (`Drift.shift`, `Drift.sd`, both in logit): the law with probability 1 - w,
the law plus the drift with probability w, so its mean moves by w * rate * D and its variance
adds w * (spread^2 + rate_se^2) * D^2 + w (1 - w) (rate * D)^2.

The origins' errors are not independent (later prefixes hold the earlier ones' points), so
`rate_se` is optimistic; `spread` carries most of the widening. The constants were set on the
development set (`bench/calibration.py --external`, the published curves) and the law-following
synthetic set (Table 1's rows): figures quoted under those names in docs/predictions.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize_scalar
from scipy.special import logit as _logit

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
# Bootstrap replicates of each prefix fit: enough for its interval's ends to judge later points
# by (its profile of A, which makes most of the width before the bend, needs none).
ORIGIN_BOOTSTRAP = 50
# The evidence's scale: a net one-sided share of comparisons outside the prefixes' intervals up
# to CHANCE_SHARE is what noise and the comparisons' correlation give on runs that follow the
# law (twice the 2.5 % one side of a 95 % interval holds); at FULL_SHARE the drift is taken
# whole.
CHANCE_SHARE = 0.05
FULL_SHARE = 0.35
# The share of the origins, the latest, whose misses are the evidence.
RECENT_ORIGINS = 0.5


# Pass rates are taken this far inside (0, 1) before their logit: a law at its ceiling of 1.0
# keeps a finite logit (20.7), and one at 0.9999, as a law with A = 1 reads far out, its own.
LOGIT_EDGE = 1e-9


def logit(p: ArrayLike) -> FloatArray:
    """The logit of pass rates `p`, kept finite at 0 and 1 (LOGIT_EDGE)."""
    out: FloatArray = _logit(np.clip(np.asarray(p, dtype=float), LOGIT_EDGE, 1.0 - LOGIT_EDGE))
    return out


@dataclass(frozen=True)
class Drift:
    """The run's drift from the law per unit of ln compute beyond its data."""

    rate: float  # logit of the pass rate gained over the law per unit of ln compute
    spread: float  # scatter of that gain (logit) per unit of ln compute
    rate_se: float
    origins: int  # prefix fits it rests on
    # Later evaluations the prefix fits were judged at, and how many of them lay above and
    # below those fits' own 95 % predictive intervals (None: not judged, the drift is taken
    # whole, as built by hand).
    compared: int = 0
    above: int = 0
    below: int = 0
    judged: bool = False
    judged_origins: int = 0  # the latest origins whose misses these are

    @property
    def weight(self) -> float:
        """How much of the drift the forecast takes, in [0, 1] (the module's rule)."""
        if not self.judged:
            return 1.0
        if self.compared == 0:
            return 0.0
        same, other = (self.above, self.below) if self.rate >= 0 else (self.below, self.above)
        net = (same - other) / self.compared
        return float(min(max((net - CHANCE_SHARE) / (FULL_SHARE - CHANCE_SHARE), 0.0), 1.0))

    @property
    def model(self) -> str:
        """`law` where the history says the law holds (weight 0), `law+drift` otherwise."""
        return "law" if self.weight == 0.0 else "law+drift"

    def shift(self, distance: ArrayLike) -> FloatArray:
        """What to add to the logit of the law's prediction `distance` (ln compute) beyond the
        data: the mixture's mean, weight * rate * distance."""
        out: FloatArray = (
            self.weight * self.rate * np.maximum(np.asarray(distance, dtype=float), 0.0)
        )
        return out

    def sd(self, distance: ArrayLike) -> FloatArray:
        """The standard deviation (logit) the mixture adds there: w (spread^2 + rate_se^2) D^2
        for the drift's own scatter and w (1 - w) (rate D)^2 for not knowing which model
        holds."""
        d = np.maximum(np.asarray(distance, dtype=float), 0.0)
        w = self.weight
        variance = w * (self.spread**2 + self.rate_se**2) + w * (1.0 - w) * self.rate**2
        out: FloatArray = math.sqrt(variance) * d
        return out

    def evidence(self) -> dict[str, float | int]:
        """What the weight rests on: the later evaluations the prefix fits were judged at, how
        many lay above and below those fits' own intervals, the prefix fits (origins)."""
        return {
            "origins": self.judged_origins,
            "compared": self.compared,
            "above": self.above,
            "below": self.below,
        }

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
    judged: list[tuple[int, int, int]] = []  # per origin: compared, above, below
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
                bootstrap=ORIGIN_BOOTSTRAP,
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
        errors.append(logit(curve[later]) - logit(early.predict(c[later])))
        band = early.law_interval(c[later], early.noise or 0.0)
        if band is not None:
            up, down = int(np.sum(y[later] > band[1])), int(np.sum(y[later] < band[0]))
            judged.append((int(later.size), up, down))
    if origins < 2:
        return None
    drift = _fit_drift(np.concatenate(distances), np.concatenate(errors), origins)
    # The latest origins' evidence: see the module's text (RECENT_ORIGINS).
    recent = judged[len(judged) - math.ceil(RECENT_ORIGINS * len(judged)) :] if judged else []
    compared, above, below = (
        (sum(column) for column in zip(*recent, strict=True)) if recent else (0, 0, 0)
    )
    return replace(
        drift, compared=compared, above=above, below=below, judged=True, judged_origins=len(recent)
    )


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
