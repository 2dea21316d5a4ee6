"""Does the law hold on this run? The fit of the evaluations in the first half of the run's
compute, asked what the last evaluation would read.

A fit's intervals assume the run follows the law; they say nothing when it does not. A run
whose early curve is not yet the law's (the demo's rises almost linearly in compute, which no
sigmoid in log compute fitted to its first half can follow: `bench/calibration.py --runs`)
extrapolates from a misfit, and its bootstrap interval is too narrow for what comes. The only
check a run can make of itself is this backtest: extrapolate from its first half to a point it
has already measured, twice the compute, as far as a half-run prediction reaches. When the last
evaluation lies outside the interval the first half gave for it, the prediction's confidence is
`Misfit` (`scalerl.fit.outlook`). On runs drawn from the law, that happens about as often as a
95 % predictive interval misses (under 10 % of draws, `bench/calibration.py`).

Two questions are asked of the same first-half fit, and answered apart (audit F2):

- the forecast's check (`inside`, `confidence`): the first half's forecast (the law, moved by as
  much of its drift as its own history supports: `scalerl.fit.drift`) and its interval, as a
  user would have read them half-way: did the forecast shown hold?
- the law's check (`law_inside`, `lawCheck`): the first half's law alone and its own interval:
  does the run follow the law?
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from scalerl.errors import InputError, ScaleRLError
from scalerl.fit.fitter import fit_curve
from scalerl.fit.points import check_points
from scalerl.fit.result import FitResult, Interval
from scalerl.spec import PREDICTION_MIN_POINTS


@dataclass(frozen=True)
class Backtest:
    """The first half's fit against the last evaluation."""

    fitted_on: int  # evaluations at compute <= half the last one's
    compute: float  # the last evaluation's
    predicted: float  # the first half's forecast there (`FitResult.forecast`)
    interval: Interval | None  # what an evaluation there would read (None: no bootstrap)
    actual: float  # what the last evaluation read
    # The first half's fit itself (None where built by hand), for callers that show more of it.
    fit: FitResult | None = field(default=None, repr=False, compare=False)
    # The first half's law alone there, and the law's own interval (None: not asked).
    law_predicted: float | None = None
    law_interval: Interval | None = None

    @property
    def inside(self) -> bool | None:
        """Whether the last evaluation read within the forecast's interval (None without one)."""
        if self.interval is None:
            return None
        return self.interval[0] <= self.actual <= self.interval[1]

    @property
    def law_inside(self) -> bool | None:
        """Whether it read within the law's own interval (None without one)."""
        if self.law_interval is None:
            return None
        return self.law_interval[0] <= self.actual <= self.law_interval[1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fittedOn": self.fitted_on,
            "compute": self.compute,
            "predicted": self.predicted,
            "interval": None if self.interval is None else list(self.interval),
            "actual": self.actual,
            "error": self.predicted - self.actual,
            "inside": self.inside,
            "law": {
                "predicted": self.law_predicted,
                "interval": None if self.law_interval is None else list(self.law_interval),
                "inside": self.law_inside,
            },
        }


def backtest(
    compute: ArrayLike,
    pass_rate: ArrayLike,
    *,
    sigma: ArrayLike | None = None,
    min_compute: float | None = None,
    **fit_options: Any,
) -> Backtest | None:
    """Fit the evaluations at compute <= half the last one's (with the run's `min_compute`,
    `sigma` and `fit_options` of `fit_curve`, as its own fit), and ask it what the last
    evaluation would read: the curve's band widened by the noise an evaluation at that pass
    rate has, as the first half's own evaluations show it (`FitResult.predictive_interval`:
    their standard errors and residuals; the band alone holds the curve, not an evaluation of
    it). Points must be sorted by compute, as `fit_curve` wants them.

    None when the first half cannot be fitted or holds fewer than PREDICTION_MIN_POINTS points
    past the floor: a prediction from that half would itself be TooEarly, and its interval from
    a handful of residuals runs narrow (on law-following draws whose half held 5 points, a
    fifth of such checks missed: `bench/calibration.py`'s early-stop scenario).
    """
    c, y = check_points(compute, pass_rate)
    if c.size < PREDICTION_MIN_POINTS:
        return None  # not even the whole run holds enough for a first half to
    se = None if sigma is None else np.asarray(sigma, dtype=float).ravel()
    if se is not None and se.size != c.size:
        raise InputError(f"sigma must hold {c.size} standard errors, one per point")
    half = c <= c[-1] / 2
    try:
        early = fit_curve(
            c[half],
            y[half],
            min_compute=min_compute,
            sigma=None if se is None else se[half],
            **fit_options,
        )
    except ScaleRLError:
        return None
    if early.points < PREDICTION_MIN_POINTS:
        return None
    last = float(c[-1])
    return Backtest(
        fitted_on=int(half.sum()),
        compute=last,
        predicted=float(early.forecast(last)),
        interval=early.predictive_interval(last),
        actual=float(y[-1]),
        fit=early,
        law_predicted=float(early.predict(last)),
        law_interval=early.law_interval(last, early.noise or 0.0),
    )
