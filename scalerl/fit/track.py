"""A run's track record: every prediction it made, kept, and once it ends scored against where it
ended (its last evaluation), by the fraction of the run each prediction had seen.

A kept prediction is the part of a fit a user bet on: where the run will end
(`predictedAtBudget` and what an evaluation there will read, `predictedAtBudgetInterval`), its
asymptote (`A`, `A_interval`, `A_atLeast`), the `confidence` word, and when it was made: `compute`,
`step` and `fractionSeen`, the compute so far over the compute of the budget the run was heading
for at that time (the run's own estimate then: compute per step can change later).

Each kept prediction also records the budget it was for (`budgetSet`: the run's maxSteps and
maxComputeHours then). A run whose budget was changed afterwards (a cluster's spec edited, a
local run resumed with a new spec) ended somewhere the prediction never aimed at: `score` marks
such a prediction `void` (with the reason), not a hit or a miss (audit F6). A run stopped by its
own prediction (`budget.stopWhen`) never reached its budget either: its predictions are kept as
`censored`, with what the run read when it stopped, and never counted as hits or misses; they
are counted and shown apart, so that a wrong stop cannot hide.

`summarise` pools the scored predictions of many runs by fraction seen (SEEN: 25, 50, 75 % of a
run), taking from each run the latest prediction made at or before that fraction: the
prediction a user had in hand at that point; and within each fraction by confidence word (a
Misfit prediction's coverage says nothing of an OK one's). Pure: no I/O, no fitting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerl.errors import DataError

Kept = dict[str, Any]
SEEN = (0.25, 0.5, 0.75)
# A run may refit after every evaluation for thousands of steps, and fit.json is rewritten on
# each fit: its track must stay bounded. It keeps the latest prediction in each bin of fraction
# seen, (k-1)/BINS < fractionSeen <= k/BINS: at most BINS + 1 predictions spread evenly over the
# run, and since every fraction in SEEN is a bin edge, the latest prediction made by each of them
# is always among those kept (`at_seen` of the kept ones is `at_seen` of them all).
BINS = 200
# A fraction within this of a bin's edge is on it: compute / budget may land a rounding off k/BINS.
EDGE = 1e-9
# The keys of a fit report (fit.json, status.prediction) a kept prediction copies.
FIT_KEYS = (
    "A",
    "A_interval",
    "A_atLeast",
    "predictedAtBudget",
    "predictedAtBudgetInterval",
    "confidence",
    "lawCheck",
    "budget",
    "budgetSet",
)


def kept_prediction(report: Mapping[str, Any], *, compute: float, step: int) -> Kept:
    """The prediction to keep from a fit `report` (fit.json's or status.prediction's keys) made
    at `compute` and `step`; its budget compute is `report["budget"]`."""
    budget = float(report["budget"])
    if not compute >= 0 or not budget > 0:
        raise DataError(
            f"a kept prediction needs compute >= 0 and a budget > 0, got "
            f"compute {compute} and budget {budget}"
        )
    kept: Kept = {"compute": float(compute), "fractionSeen": min(1.0, compute / budget)}
    kept["step"] = int(step)
    kept.update({key: report.get(key) for key in FIT_KEYS})
    return kept


def keep(track: Sequence[Kept], prediction: Kept, bins: int = BINS) -> list[Kept]:
    """`track` with `prediction` added: it replaces those kept in its bin of fraction seen (see
    BINS), and those at the same or a larger compute (a refit of the same evaluations, as the
    runner's last fit repeats its latest, is one prediction; kept ones past the run's data come
    from an earlier history in the same folder, not from this run)."""
    if bins < 1:
        raise ValueError(f"a track needs at least 1 bin, got {bins}")
    here = _bin(prediction["fractionSeen"], bins)
    out = [
        p
        for p in track
        if float(p["compute"]) < prediction["compute"] and _bin(p["fractionSeen"], bins) != here
    ]
    out.append(prediction)
    return out


def _bin(fraction: float, bins: int) -> int:
    return math.ceil((float(fraction) - EDGE) * bins)


@dataclass(frozen=True)
class Outcome:
    """Where a run ended: its last evaluation's pass rate, at `compute`; the budget it ended
    under (`budget_set`, as a kept prediction's `budgetSet`; None: unknown), and why it was
    stopped by its prediction (`stopped`; None: it ran to its end)."""

    pass_rate: float
    compute: float
    budget_set: Mapping[str, Any] | None = None
    stopped: str | None = None


def score(track: Iterable[Kept], outcome: Outcome) -> list[Kept]:
    """Each kept prediction with how it fared: `actual` (the last evaluation's pass rate),
    `error` (predicted minus actual) and `inside` (actual within predictedAtBudgetInterval; null
    where the prediction had no interval), `width` of that interval. A prediction made for
    another budget than the run ended under is `void` (`voidReason` says which), one of a run
    its prediction stopped `censored` (`censoredReason`): both with error and inside null."""
    rows = []
    for kept in track:
        interval = kept.get("predictedAtBudgetInterval")
        row = {**kept, "actual": outcome.pass_rate, "actualCompute": outcome.compute}
        row["width"] = None if not interval else float(interval[1]) - float(interval[0])
        made_for = kept.get("budgetSet")
        if outcome.budget_set is not None and made_for is not None:
            changed = _limits(made_for) != _limits(outcome.budget_set)
        else:
            changed = False
        row["void"] = changed
        row["censored"] = outcome.stopped is not None
        if changed:
            row["voidReason"] = (
                f"made for the budget {dict(made_for or {})}; the run ended under "
                f"{dict(outcome.budget_set or {})}"
            )
        if outcome.stopped is not None:
            row["censoredReason"] = f"the run was stopped by its prediction: {outcome.stopped}"
        if changed or outcome.stopped is not None:
            row["error"], row["inside"] = None, None
        else:
            row["error"] = float(kept["predictedAtBudget"]) - outcome.pass_rate
            row["inside"] = (
                None if not interval else interval[0] <= outcome.pass_rate <= interval[1]
            )
        rows.append(row)
    return rows


def _limits(budget: Mapping[str, Any]) -> dict[str, float]:
    """A budgetSet's limits as numbers, an unset one left out: a Kubernetes status drops a null
    field and may give 100 back for 100.0, and neither is a change of budget."""
    return {key: float(value) for key, value in budget.items() if value is not None}


def at_seen(track: Iterable[Kept], seen: Sequence[float] = SEEN) -> dict[float, Kept]:
    """For each fraction in `seen`, the latest kept prediction (the largest compute) made at or
    before it (fractionSeen not above it); fractions no prediction had reached are left out."""
    out: dict[float, Kept] = {}
    for kept in track:
        for fraction in seen:
            current = out.get(fraction)
            if kept["fractionSeen"] <= fraction + EDGE and (
                current is None or kept["compute"] >= current["compute"]
            ):
                out[fraction] = kept
    return out


def summarise(runs: Iterable[Sequence[Kept]], seen: Sequence[float] = SEEN) -> list[dict[str, Any]]:
    """The scored rows of many runs (one sequence per run) pooled by fraction seen: per fraction,
    `runs` (how many runs had a prediction by then), `withInterval`, `held` (of those, how many
    intervals held the actual), `coverage` (held / withInterval), `medianError`,
    `medianAbsError`, `medianWidth` (null where nothing to take a median of), over the scored
    predictions only; `void` (predictions made for another budget), `censored` (of runs their
    prediction stopped) and `censoredReads` (what those runs read when stopped) apart; and
    `byConfidence`: per confidence word, withInterval, held and coverage."""
    picked: dict[float, list[Kept]] = {fraction: [] for fraction in seen}
    for rows in runs:
        for fraction, row in at_seen(rows, seen).items():
            picked[fraction].append(row)
    return [_bucket(fraction, picked[fraction]) for fraction in seen]


def _bucket(fraction: float, rows: list[Kept]) -> dict[str, Any]:
    void = [row for row in rows if row.get("void")]
    censored = [row for row in rows if row.get("censored") and not row.get("void")]
    scored = [row for row in rows if not row.get("void") and not row.get("censored")]
    held = [row["inside"] for row in scored if row.get("inside") is not None]
    widths = [row["width"] for row in scored if row.get("width") is not None]
    errors = [float(row["error"]) for row in scored if row.get("error") is not None]
    words: dict[str, list[bool]] = {}
    for row in scored:
        if row.get("inside") is not None:
            words.setdefault(str(row.get("confidence")), []).append(bool(row["inside"]))
    return {
        "seen": fraction,
        "runs": len(rows),
        "withInterval": len(held),
        "held": sum(held),
        "coverage": sum(held) / len(held) if held else None,
        "medianError": statistics.median(errors) if errors else None,
        "medianAbsError": statistics.median(abs(e) for e in errors) if errors else None,
        "medianWidth": statistics.median(widths) if widths else None,
        "void": len(void),
        "censored": len(censored),
        "censoredReads": [float(row["actual"]) for row in censored],
        "byConfidence": {
            word: {"withInterval": len(hits), "held": sum(hits), "coverage": sum(hits) / len(hits)}
            for word, hits in sorted(words.items())
        },
    }


def bounded(track: Sequence[Kept], seen: Sequence[float] = SEEN) -> list[Kept]:
    """The part of a track a cluster keeps in the run's status: the prediction `at_seen` each
    fraction, marked with it (`seen`); at most len(seen) entries, whatever the run's length.
    Folding each new prediction in (`bounded(keep(old, new))`) gives what `bounded` of the
    whole track would: the latest at or before a fraction is the latest of the latest."""
    return [{**kept, "seen": fraction} for fraction, kept in sorted(at_seen(track, seen).items())]
