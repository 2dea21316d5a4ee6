"""How far one evaluation scatters about the curve, as a function of the pass rate it reads.

A pass rate that is a mean over prompts and samples (mean@k over n prompts) varies like a
binomial's: its standard error is about sqrt(c p (1 - p)), with c ~ 1 / (the trials behind it),
largest at p = 1/2 and shrinking towards 0 and 1. A predictive interval at a pass rate p must use
the noise an evaluation there has, not the last evaluation's: near a ceiling of 0.99 that noise is
a fraction of the one at 0.8 (audit F10).

`ObservationNoise.estimate` reads c from the run itself:

- from each evaluation's standard error (a history's `pass_rate_se`): c = sum(se_i^2 v_i) /
  sum(v_i^2) with v_i = p_i (1 - p_i), the least-squares fit of se_i^2 = c v_i;
- from the fit's residuals (the spread of the evaluations about the fitted curve): c = the
  residuals' variance over the mean of v_i. An evaluation scatters about the curve by its
  sampling noise and by how much the policy itself moved between evaluations, which the
  per-prompt standard errors do not see; with both, the larger c is kept.

The standard error never falls below `floor`: at p = 0 or 1 the formula gives 0, yet a rate one
trial away from the edge is as likely; the floor is the standard error of a rate c from the edge,
sqrt(c * c (1 - c)) ~ c, i.e. about one trial in 1/c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


@dataclass(frozen=True)
class ObservationNoise:
    """se(p) = max(sqrt(c p (1 - p)), floor): one evaluation's standard error at pass rate p."""

    c: float
    floor: float

    def se(self, pass_rate: ArrayLike) -> NDArray[np.float64]:
        p = np.clip(np.asarray(pass_rate, dtype=float), 0.0, 1.0)
        out: NDArray[np.float64] = np.maximum(np.sqrt(self.c * p * (1.0 - p)), self.floor)
        return out

    @classmethod
    def constant(cls, se: float) -> ObservationNoise:
        """The same standard error at every pass rate (a caller that knows only one)."""
        return cls(c=0.0, floor=max(float(se), 0.0))

    @classmethod
    def estimate(
        cls,
        pass_rate: ArrayLike,
        *,
        sigma: ArrayLike | None = None,
        residuals: ArrayLike | None = None,
        dof: int | None = None,
    ) -> ObservationNoise:
        """c from the evaluations' standard errors (`sigma`) and/or the fit's residuals (in
        pass-rate units, with `dof` degrees of freedom left: their variance is sum r^2 / dof);
        the larger of the two when both say something."""
        p = np.clip(np.asarray(pass_rate, dtype=float).ravel(), 0.0, 1.0)
        v = np.maximum(p * (1.0 - p), 1e-4)  # a rate at 0 or 1 still says something about c
        candidates = [0.0]
        if sigma is not None:
            se = np.asarray(sigma, dtype=float).ravel()
            if se.size == p.size and np.any(se > 0):
                candidates.append(float(np.sum(se * se * v) / np.sum(v * v)))
        if residuals is not None:
            r = np.asarray(residuals, dtype=float).ravel()
            if r.size and np.all(np.isfinite(r)):
                variance = float(r @ r) / max(dof if dof is not None else r.size, 1)
                candidates.append(variance / float(np.mean(v)))
        c = max(candidates)
        return cls(c=c, floor=math.sqrt(c * c * (1.0 - min(c, 0.5))))
