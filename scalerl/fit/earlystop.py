"""Which of a sweep's variants cannot win and may be stopped early: the same rule for `scalerl
sweep` and the operator.

A fit alone cannot decide it. A good recipe's curve often leaves the law (its half-run backtest
misses: `Misfit`), and a fit's intervals then say nothing; a fit of few points is `TooEarly`.
So the rule judges on what was measured, and uses a fit only where its confidence lets it
(`OK` or `Unchecked`). A variant is stopped when both hold, against the yardstick (of the
variants with at least `earlyStop.minPoints` evaluations past fit.minCompute, the one with the
highest floor below):

(a) measured: the mean of its last RECENT evaluations lies below the yardstick's pass rate at
    the same compute (the yardstick's evaluations interpolated in compute) by more than Z
    combined standard errors, and by more than A_MARGIN (what the paper counts as equal);
(b) ceiling: its ceiling lies below the yardstick's floor by more than A_MARGIN, where
    - a variant's measured ceiling is its last RECENT evaluations' mean + Z SE, plus its recent
      rise (those RECENT against the RECENT before) per compute carried on to its budget: a
      bound on what it reaches within its budget, which is what the sweep would get from it.
      A variant whose recent rise is itself beyond Z SE has none (it is still rising);
    - the yardstick's measured floor is its last RECENT evaluations' mean - Z SE: a run reaches
      at least what it measured, and a Misfit run, whose law underpredicts, still defends that;
    - measured bounds are tried first; where they do not decide, a trusted fit's bounds may:
      the ends of its forecast's interval at its budget (`scalerl.fit.decision.fit_bounds`, the
      interval stopWhen reads: what the run reaches within what it may spend), the upper end
      (never below its mean + Z SE) as the variant's ceiling, the lower end, where higher, as
      the yardstick's floor. A fit is trusted when `OK` or `Unchecked`, of minPoints points,
      and its interval says something (narrower than [0, 1]). So a variant still rising,
      without such a fit, is never stopped.

It never stops: a variant with fewer than `minPoints` evaluations past the floor, or beside a
yardstick with fewer; one whose evaluations lack standard errors (nothing to weigh the gap
with); one whose ceiling comes within A_MARGIN of the yardstick's floor (inside the leader's
band); one within A_MARGIN or Z SE of the yardstick at the same compute; the yardstick itself.
The stop names the evidence that decided (b): "measured" when measured bounds alone did, else
"fit".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from scalerl.fit.compare import A_MARGIN
from scalerl.fit.decision import fit_bounds
from scalerl.fit.fitter import compute_floor
from scalerl.fit.leaderboard import Standing, compute_left
from scalerl.fit.outlook import OK, UNCHECKED

Z = 3.0  # standard errors: a gap this wide arises from noise in about 1 check of 700
RECENT = 3  # evaluations averaged: one noisy evaluation decides nothing

Evidence = Literal["measured", "fit"]


@dataclass(frozen=True)
class Bound:
    value: float
    evidence: Evidence
    how: str  # the words for the reason


@dataclass(frozen=True)
class Stop:
    """A variant to stop: the yardstick it lost to, the evidence that decided, and why."""

    yardstick: str
    evidence: Evidence
    reason: str


def losers(standings: Sequence[Standing], min_points: int) -> dict[str, Stop]:
    """The variants to stop now, with the evidence and the reason (the module's rule)."""
    judged = [s for s in standings if _points(s) >= min_points and s.evaluations.se is not None]
    if len(judged) < 2:
        return {}
    floors = {s.name: _floor(s, min_points) for s in judged}
    lead = max(judged, key=lambda s: (floors[s.name][-1].value, s.name))
    out = {}
    for s in judged:
        if s.name != lead.name and (stop := _judge(s, lead, floors[lead.name], min_points)):
            out[s.name] = stop
    return out


def _judge(v: Standing, lead: Standing, floors: list[Bound], min_points: int) -> Stop | None:
    """Stop `v` against the yardstick `lead`: (a), then (b) on measured bounds alone, else on
    bounds a trusted fit gives (`floors`: the lead's measured floor, then the fit-aware one)."""
    gap = _measured_gap(v, lead)
    if gap is None or gap[0] <= max(Z * gap[1], A_MARGIN):
        return None
    ceilings = _ceilings(v, min_points)
    for ceiling, floor in ((ceilings[0], floors[0]), (ceilings[-1], floors[-1])):
        if ceiling is not None and ceiling.value + A_MARGIN < floor.value:
            evidence: Evidence = (
                "fit" if "fit" in (ceiling.evidence, floor.evidence) else "measured"
            )
            reason = (
                f"measured {gap[0]:.3f} below {lead.name} at the same compute (> {Z:g} SE = "
                f"{Z * gap[1]:.3f}); its ceiling {ceiling.value:.3f} ({ceiling.how}) lies "
                f"more than {A_MARGIN:g} below {lead.name}'s floor {floor.value:.3f} ({floor.how})"
            )
            return Stop(lead.name, evidence, reason)
    return None


def _past_floor(s: Standing) -> np.ndarray:
    """Which evaluations count: trained ones (compute > 0) at or above fit.minCompute."""
    c = s.evaluations.compute
    if not c.size:
        return np.zeros(0, dtype=bool)
    cutoff = compute_floor(float(c[-1]), s.run.spec.fit.min_compute)
    return np.asarray((c > 0) & (c >= cutoff))


def _points(s: Standing) -> int:
    return int(_past_floor(s).sum())


def _recent(s: Standing, upto: float = math.inf) -> tuple[np.ndarray, float, float] | None:
    """Its last RECENT counted evaluations at compute <= `upto`: their indices, mean, SE."""
    index = np.flatnonzero(_past_floor(s) & (s.evaluations.compute <= upto))[-RECENT:]
    if index.size < RECENT:
        return None
    return index, *_mean_se(s, index)


def _mean_se(s: Standing, index: np.ndarray) -> tuple[float, float]:
    """The mean of the evaluations at `index` and its standard error."""
    ev = s.evaluations
    assert ev.se is not None
    mean = float(np.mean(ev.pass_rate[index]))
    return mean, float(np.sqrt(np.sum(ev.se[index] ** 2)) / index.size)


def _measured_gap(v: Standing, lead: Standing) -> tuple[float, float] | None:
    """How far v's recent evaluations lie below the yardstick's at their computes, and the SE
    of that gap. The yardstick's interpolated rates share their neighbouring evaluations, so
    its SE is not averaged down: the largest of those neighbours' counts whole."""
    le, ve = lead.evaluations, v.evaluations
    assert le.se is not None
    recent = _recent(v, upto=float(le.compute[-1]))
    if recent is None:
        return None
    index, mean_v, se_v = recent
    at = ve.compute[index]
    lead_rate = float(np.mean(np.interp(at, le.compute, le.pass_rate)))
    right = np.clip(np.searchsorted(le.compute, at), 0, le.compute.size - 1)
    left = np.clip(right - 1, 0, le.compute.size - 1)
    se_lead = float(np.max(np.maximum(le.se[left], le.se[right])))
    return lead_rate - mean_v, math.hypot(se_v, se_lead)


def _trusted(s: Standing, min_points: int) -> tuple[Mapping[str, Any], tuple[float, float]] | None:
    """Its run's own fit and the bounds it gives (`scalerl.fit.decision.fit_bounds`: the
    forecast's interval at the run's budget, the one stopWhen reads) when its confidence lets
    its intervals speak."""
    fit = s.prediction or {}
    ok = fit.get("confidence") in (OK, UNCHECKED) and int(fit.get("points") or 0) >= min_points
    bounds = fit_bounds(fit) if ok else None
    return None if bounds is None else (fit, bounds)


def _floor(s: Standing, min_points: int) -> list[Bound]:
    """What it reaches at least: its measured floor; then, where its trusted fit's lower bound
    (the forecast interval's low end at its budget) is higher, that."""
    recent = _recent(s)
    assert recent is not None  # judged variants have >= minPoints >= RECENT evaluations
    _, mean, se = recent
    floors = [Bound(mean - Z * se, "measured", f"last {RECENT} evaluations' mean - {Z:g} SE")]
    trusted = _trusted(s, min_points)
    if trusted is not None:
        fit, (low, _) = trusted
        if low > floors[0].value:
            floors.append(
                Bound(low, "fit", f"its forecast's lower bound at its budget, {fit['confidence']}")
            )
    return floors


def _ceilings(s: Standing, min_points: int) -> list[Bound | None]:
    """What it reaches at most within its budget: its measured ceiling (None: still rising);
    then, with a trusted fit, the upper end of its forecast's interval at its budget (never
    below what it measured)."""
    measured = _measured_ceiling(s)
    trusted = _trusted(s, min_points)
    if trusted is None:
        return [measured]
    fit, (_, high) = trusted
    recent = _recent(s)
    assert recent is not None
    seen = recent[1] + Z * recent[2]
    bound = Bound(
        max(high, seen), "fit", f"its forecast's upper bound at its budget, {fit['confidence']}"
    )
    return [measured, bound]


def _measured_ceiling(s: Standing) -> Bound | None:
    ev = s.evaluations
    counted = np.flatnonzero(_past_floor(s))
    if counted.size < 2 * RECENT:
        return None
    now, before = counted[-RECENT:], counted[-2 * RECENT : -RECENT]
    (mean_now, se_now), (mean_before, se_before) = _mean_se(s, now), _mean_se(s, before)
    rise = mean_now - mean_before
    if rise > Z * math.hypot(se_now, se_before):
        return None  # still rising: only a trusted fit can bound it
    per_compute = max(0.0, rise) / max(float(np.mean(ev.compute[now] - ev.compute[before])), 1e-12)
    value = mean_now + Z * se_now + per_compute * compute_left(s)
    how = f"no rise beyond noise: last {RECENT} evaluations' mean + {Z:g} SE + their rise to budget"
    return Bound(value, "measured", how)
