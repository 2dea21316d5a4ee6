"""A sweep's variants ranked the paper's way, one row each: the same function for `scalerl sweep`
(leaderboard.json) and the operator (a ScaleRLSweep's status.leaderboard and its Leader column).

The ranking. The paper's rule compares two runs: a higher asymptote A wins; A values within
A_MARGIN (0.02) are equal, and then the run whose curve, refitted at their shared A, has the
higher B (reaches it with less compute) is ahead. Applied pairwise that rule is not transitive
(A 0.600/B 3.0 beats A 0.615/B 2.0 by B, which beats A 0.630/B 1.2 by B, which beats the first by
A), so a sort by it depended on the order the variants were listed. The leaderboard is instead
one total order that keeps the rule's meaning:

1. the fitted variants, by A from the highest down, form groups: the best remaining A and every
   variant within A_MARGIN of it are one group (their A values count as equal);
2. a group is ranked by B refitted at the group's shared A (the mean of its A values), with each
   fit's own points, weights, floor and R0 (`scalerl.fit.compare`); a variant whose refit fails
   (the shared A at or below its R0) follows those that refit, by its own A;
3. the groups follow one another from the highest A down; variants without a fit come last;
4. ties (equal B, equal A) go by name.

So every variant of a higher group has a higher A than every variant of a lower one, and within
a group the comparison is the paper's B at a shared A.

A fit whose points bound A only from below (`A_atLeast`: C_mid beyond the data, as a flat run's
fit often is) has no A to compare: its bound is what the data defend, and it grows with the
compute a variant has run, so two such bounds say more about how far each ran than about which
is better. Such open variants are ranked among themselves by what they read at equal compute:
each one's fitted curve at the compute all of them reached (the least of their last
evaluations'); readings within A_MARGIN of the best remaining one are tied (`tiedWith` names the
others; listed by name). Each tied set, as one, takes its place among the closed variants by the
highest bound in it: ahead of a closed variant whose A that bound reaches. The order depends
only on the fits.

Each variant is fitted from its own evaluations, weighted by their standard errors, as its run's
own fit is (`fit.json`, `status.prediction`); the row shows that fit, the one ranked. The early
stop of variants that cannot win is `scalerl.fit.earlystop`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerl.errors import FitError, ScaleRLError
from scalerl.fit.compare import A_MARGIN, ROUNDING, refit_b
from scalerl.fit.fitter import fit_curve
from scalerl.fit.result import FitResult
from scalerl.spec import FAILED, STOPPED, ScaleRLRun

ROW_KEYS = (
    "name",
    "run",
    "phase",
    "A",
    "A_interval",
    "A_atLeast",
    "B",
    "C_mid",
    "points",
    "confidence",
    "compute",
    "computeUnit",
    "stopReason",
    "stopEvidence",
    "failure",
    "computeSaved",
    "tiedWith",
)


@dataclass(frozen=True)
class Evaluations:
    """A run's evaluations sorted by compute: step, compute, pass rate and its standard error
    (`se` None when some evaluation lacks one)."""

    step: np.ndarray
    compute: np.ndarray
    pass_rate: np.ndarray
    se: np.ndarray | None

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Mapping[str, Any]],
        *,
        compute: str,
        pass_rate: str,
        se: str,
        excluded: str = "",
    ) -> Evaluations:
        """From history rows (`compute`, `pass_rate`, `pass_rate_se`, `fit_excluded`) or
        status.evaluations (`computeHours`, `passRate`, `passRateSE`, `fitExcluded`): name the
        keys. An evaluation marked left out of the fit (`excluded`: too many of its samples
        could not be scored) is not among them, as the run's own fit leaves it out."""
        kept = [r for r in rows if not (excluded and r.get(excluded))]
        ordered = sorted(kept, key=lambda r: float(r[compute]))
        errors = [r.get(se) for r in ordered]
        return cls(
            step=np.array([int(r.get("step") or 0) for r in ordered], dtype=int),
            compute=np.array([float(r[compute]) for r in ordered], dtype=float),
            pass_rate=np.array([float(r[pass_rate]) for r in ordered], dtype=float),
            se=None if any(e is None for e in errors) else np.array(errors, dtype=float),
        )

    def __len__(self) -> int:
        return int(self.compute.size)


@dataclass(frozen=True)
class Standing:
    """A variant as a sweep sees it: its run, phase, evaluations and its run's own latest fit
    (`prediction`: fit.json or status.prediction, None before the first), and why it stopped or
    failed."""

    name: str
    run: ScaleRLRun
    phase: str
    evaluations: Evaluations
    prediction: Mapping[str, Any] | None = None
    stop_reason: str | None = None
    stop_evidence: str | None = None
    failure: str | None = None


@dataclass(frozen=True)
class Entry:
    """One variant: its fit (None while it has none) and the points the fit was made from."""

    name: str
    fit: FitResult | None
    compute: np.ndarray
    pass_rate: np.ndarray


def board(
    standings: Sequence[Standing], entries: Sequence[Entry] | None = None
) -> list[dict[str, Any]]:
    """The leaderboard: each variant fitted from its evaluations (`entries`, when the caller
    has fitted them already: `entry_of` each), ranked, one row each."""
    by_name = {s.name: s for s in standings}
    entries = [entry_of(s) for s in standings] if entries is None else entries
    ranked, tied = _order(entries)
    return [{**row(by_name[e.name], e.fit), "tiedWith": tied.get(e.name, [])} for e in ranked]


def entry_of(standing: Standing) -> Entry:
    """The variant's fit of its evaluations, weighted by their SEs as its run's own fit is."""
    ev = standing.evaluations
    try:
        fit = fit_curve(
            ev.compute, ev.pass_rate, min_compute=standing.run.spec.fit.min_compute, sigma=ev.se
        )
    except ScaleRLError:  # too few points yet (a variant stopped or failed early, or pending)
        fit = None
    return Entry(standing.name, fit, ev.compute, ev.pass_rate)


def rank(entries: Sequence[Entry]) -> list[Entry]:
    """Best first by the rule of the module's text; the same for any order of `entries`."""
    return _order(entries)[0]


def _order(entries: Sequence[Entry]) -> tuple[list[Entry], dict[str, list[str]]]:
    """`rank`'s order, and for each open variant tied with others, their names."""
    closed = sorted(
        (e for e in entries if e.fit is not None and e.fit.A_at_least is None),
        key=lambda e: (-_a(e), e.name),
    )
    ranked: list[Entry] = []
    while closed:
        top = _a(closed[0])
        group = [e for e in closed if _a(e) >= top - A_MARGIN - ROUNDING]
        closed = closed[len(group) :]
        ranked += _by_b(group)
    merged: list[Entry] = []
    ties: dict[str, list[str]] = {}
    for tied in _open_sets(entries):  # each set ahead of the closed ones its best bound reaches
        bound = max(_a(e) for e in tied)
        while ranked and _a(ranked[0]) > bound:
            merged.append(ranked.pop(0))
        merged += tied
        if len(tied) > 1:
            ties.update({e.name: [o.name for o in tied if o is not e] for e in tied})
    unfitted = sorted((e for e in entries if e.fit is None), key=lambda e: e.name)
    return merged + ranked + unfitted, ties


def _open_sets(entries: Sequence[Entry]) -> list[list[Entry]]:
    """The variants whose A is bounded only from below, best first by what their fitted curves
    read at the compute all of them reached, in sets tied within A_MARGIN (each by name)."""
    found = [e for e in entries if e.fit is not None and e.fit.A_at_least is not None]
    if not found:
        return []
    shared = min(float(e.compute[-1]) for e in found)
    reads = {e.name: float(e.fit.predict(shared)) for e in found if e.fit is not None}
    left = sorted(found, key=lambda e: (-reads[e.name], e.name))
    sets = []
    while left:
        top = reads[left[0].name]
        tied = [e for e in left if reads[e.name] >= top - A_MARGIN - ROUNDING]
        left = left[len(tied) :]
        sets.append(sorted(tied, key=lambda e: e.name))
    return sets


def _a(entry: Entry) -> float:
    """The A it is ranked by: its fit's, or where the points bound A only from below
    (`A_at_least`), that bound: what the data defend, not the fit's guess beyond them."""
    assert entry.fit is not None
    at_least = entry.fit.A_at_least
    return entry.fit.A if at_least is None else at_least


def _by_b(group: list[Entry]) -> list[Entry]:
    """A group of equal A ranked by B refitted at their shared A; failed refits after, by A."""
    if len(group) == 1:
        return group
    shared = float(np.mean([_a(e) for e in group]))
    b: dict[str, float] = {}
    for e in group:
        assert e.fit is not None
        try:
            b[e.name] = refit_b(e.name, e.fit, (e.compute, e.pass_rate), shared)
        except FitError:
            b[e.name] = -np.inf
    return sorted(group, key=lambda e: (-b[e.name], -_a(e), e.name))


def row(standing: Standing, fit: FitResult | None) -> dict[str, Any]:
    """One line of the leaderboard (keys ROW_KEYS): the fit it was ranked by, its run's own
    confidence word, the compute it spent (its last evaluation's) and, once stopped, the compute
    its budget would have spent beyond that."""
    ev, prediction = standing.evaluations, standing.prediction or {}
    return {
        "name": standing.name,
        "run": standing.run.name,
        "phase": standing.phase,
        "A": None if fit is None else fit.A,
        "A_interval": None if fit is None or fit.A_interval is None else list(fit.A_interval),
        "A_atLeast": None if fit is None else fit.A_at_least,
        "B": None if fit is None else fit.B,
        "C_mid": None if fit is None else fit.C_mid,
        "points": None if fit is None else fit.points,
        "confidence": prediction.get("confidence"),
        "compute": float(ev.compute[-1]) if len(ev) else 0.0,
        "computeUnit": standing.run.spec.compute_unit,
        "stopReason": standing.stop_reason if standing.phase == STOPPED else None,
        "stopEvidence": standing.stop_evidence if standing.phase == STOPPED else None,
        "failure": standing.failure if standing.phase == FAILED else None,
        "computeSaved": compute_left(standing) if _stopped_early(standing) else None,
    }


def _stopped_early(standing: Standing) -> bool:
    """Stopped by the early-stop rule (its evidence named), not by the sweep's own end."""
    return standing.phase == STOPPED and standing.stop_evidence is not None


def compute_left(standing: Standing) -> float:
    """What its budget would spend beyond its last evaluation (step and compute), to where the
    budget ends at that pace: once stopped (right after that evaluation), the compute saved."""
    ev = standing.evaluations
    if not len(ev):
        return 0.0
    step, spent = int(ev.step[-1]), float(ev.compute[-1])
    end, _ = standing.run.spec.budget.end(step, spent)
    return max(0.0, end - spent)
