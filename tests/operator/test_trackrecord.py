"""status.trackRecord: each fit Job folds its prediction into a bounded summary; the operator
scores it when the run Succeeds; the operator's metrics pool the scored runs."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from scalerl.metrics import RunMetrics
from scalerl.operator.trackrecord import ended, scored_predictions, with_prediction

BUDGET = 100.0


def evaluations(count: int) -> list[dict[str, Any]]:
    """status.evaluations: one every 5 compute-hours from 0 (a run of budget 100)."""
    return [
        {"step": 10 * i, "computeHours": 5.0 * i, "passRate": round(0.2 + 0.02 * i, 6)}
        for i in range(count)
    ]


def prediction(predicted: float, half_width: float = 0.05) -> dict[str, Any]:
    """status.prediction's keys a track record reads."""
    return {
        "A": predicted + 0.05,
        "A_interval": [predicted, predicted + 0.1],
        "predictedAtBudget": predicted,
        "predictedAtBudgetInterval": [predicted - half_width, predicted + half_width],
        "confidence": "OK",
        "budget": BUDGET,
        "points": 9,
    }


def fitted_run(fits: dict[int, float]) -> dict[str, Any] | None:
    """The record after fit Jobs at these evaluation counts, each predicting its value."""
    record = None
    for count, predicted in fits.items():
        record = with_prediction(record, prediction(predicted), evaluations(count))
    return record


def test_a_run_keeps_the_latest_prediction_by_each_fraction_and_no_more() -> None:
    fits = {n: 0.5 + n / 100 for n in range(3, 21)}  # every evaluation from 10 % to 95 % seen
    record = fitted_run(fits)
    assert record is not None
    kept = record["predictions"]
    assert [(p["seen"], p["fractionSeen"], p["step"]) for p in kept] == [
        (0.25, 0.25, 50),
        (0.5, 0.5, 100),
        (0.75, 0.75, 150),
    ]
    assert [p["predictedAtBudget"] for p in kept] == [0.56, 0.61, 0.66]
    assert "outcome" not in record and scored_predictions(record) is None


def test_the_end_scores_each_kept_prediction_against_the_last_evaluation() -> None:
    record = ended(fitted_run({5: 0.5, 9: 0.58, 14: 0.62}), evaluations(21))
    assert record is not None
    assert record["outcome"] == {"passRate": 0.6, "computeHours": 100.0}
    rows = scored_predictions(record)
    assert rows is not None
    assert [r["seen"] for r in rows] == [0.25, 0.5, 0.75]
    assert [r["error"] for r in rows] == pytest.approx([-0.1, -0.02, 0.02])
    assert [r["inside"] for r in rows] == [False, True, True]
    assert [r["width"] for r in rows] == pytest.approx([0.1, 0.1, 0.1])


def test_a_last_fit_after_the_end_is_scored_with_the_same_outcome() -> None:
    record = ended(fitted_run({5: 0.5}), evaluations(21))
    again = with_prediction(record, prediction(0.6), evaluations(21))
    assert again is not None and again["outcome"] == {"passRate": 0.6, "computeHours": 100.0}
    # Made at 100 % of the run, it stands for no fraction: the one made at 20 % stands for all.
    assert [r["error"] for r in again["predictions"]] == pytest.approx([-0.1] * 3)


def test_a_run_without_a_kept_prediction_or_an_evaluation_is_not_scored() -> None:
    assert ended(None, evaluations(3)) is None
    assert ended(fitted_run({5: 0.5}), []) is None
    assert with_prediction(None, prediction(0.5), []) is None


def test_the_operators_gauges_pool_the_scored_runs_by_fraction_seen() -> None:
    metrics = RunMetrics()
    runs = {
        "r1": ended(fitted_run({5: 0.50, 10: 0.58, 15: 0.61}), evaluations(21)),
        "r2": ended(fitted_run({5: 0.70, 10: 0.66, 15: 0.64}), evaluations(21)),
        "r3": fitted_run({5: 0.40}),  # still running: not in the pool
    }
    for name, record in runs.items():
        metrics.track_record.set_run("ns", name, scored_predictions(record))

    def sample(name: str, seen: str) -> float | None:
        return metrics.registry.get_sample_value(f"scalerl_track_record_{name}", {"seen": seen})

    actual = 0.6
    predicted = {"0.25": [0.50, 0.70], "0.5": [0.58, 0.66], "0.75": [0.61, 0.64]}
    for seen, values in predicted.items():
        assert sample("runs", seen) == 2
        inside = [abs(v - actual) <= 0.05 for v in values]
        assert sample("coverage", seen) == pytest.approx(sum(inside) / 2)
        median = statistics.median(v - actual for v in values)
        assert sample("median_error", seen) == pytest.approx(median)
        assert sample("median_width", seen) == pytest.approx(0.1)
    metrics.forget("ns", "r2")  # the run was deleted: it leaves the pool
    assert sample("runs", "0.5") == 1
    assert sample("median_error", "0.5") == pytest.approx(-0.02)
    metrics.forget("ns", "r1")
    assert sample("runs", "0.5") == 0 and sample("median_error", "0.5") is None


SET = {"maxSteps": 200, "maxComputeHours": BUDGET}


def made_for(record: dict[str, Any] | None, budget: dict[str, Any]) -> dict[str, Any] | None:
    """`record` as fit Jobs keep it: each prediction with the budget it was made for (the API
    server gives numbers back as it likes: 100 for 100.0, and drops a null limit)."""
    assert record is not None
    return {**record, "predictions": [{**p, "budgetSet": budget} for p in record["predictions"]]}


def test_a_prediction_made_for_another_budget_is_void_not_a_miss() -> None:
    # Two fits under maxSteps 200; `kubectl edit` then raised it to 300 and the run ended there.
    kept = made_for(fitted_run({5: 0.5, 10: 0.6}), SET)
    record = ended(kept, evaluations(21), {"maxSteps": 300, "maxComputeHours": BUDGET})
    rows = scored_predictions(record)
    assert rows is not None and rows
    assert all(r["void"] and r["error"] is None and r["inside"] is None for r in rows)
    assert "300" in rows[0]["voidReason"]
    # The same budget, as the status gives it back (int for float, a null limit dropped): scored.
    same = made_for(fitted_run({5: 0.5, 10: 0.6}), {"maxSteps": 200.0, "maxComputeHours": 100})
    rows = scored_predictions(ended(same, evaluations(21), SET))
    assert rows is not None
    assert [r["void"] for r in rows] == [False] * 3
    assert [r["error"] for r in rows] == pytest.approx([-0.1, 0.0, 0.0])
    unset = made_for(fitted_run({5: 0.5}), {"maxSteps": 200})
    rows = scored_predictions(
        ended(unset, evaluations(21), {"maxSteps": 200, "maxComputeHours": None})
    )
    assert rows is not None and not rows[0]["void"]


def test_a_run_stopped_by_its_prediction_is_censored_with_what_it_read() -> None:
    reason = "the forecast at the budget is below 0.8: 0.61 [0.55, 0.67]"
    record = ended(made_for(fitted_run({5: 0.5}), SET), evaluations(8), SET, stopped=reason)
    assert record is not None
    assert record["outcome"] == {
        "passRate": evaluations(8)[-1]["passRate"],
        "computeHours": 35.0,
        "budgetSet": SET,
        "stopped": reason,
    }
    rows = scored_predictions(record)
    assert rows is not None
    assert all(r["censored"] and r["error"] is None and r["inside"] is None for r in rows)
    assert rows[0]["censoredReason"].endswith(reason)


def test_the_operators_gauges_count_void_and_censored_runs_apart() -> None:
    metrics = RunMetrics()
    scored = ended(made_for(fitted_run({5: 0.5, 10: 0.58, 15: 0.61}), SET), evaluations(21), SET)
    edited = {"maxSteps": 400, "maxComputeHours": BUDGET}
    void = ended(made_for(fitted_run({5: 0.9, 10: 0.9, 15: 0.9}), SET), evaluations(21), edited)
    stopped = ended(made_for(fitted_run({5: 0.1}), SET), evaluations(8), SET, stopped="A < 0.8")
    for name, record in {"scored": scored, "void": void, "stopped": stopped}.items():
        metrics.track_record.set_run("ns", name, scored_predictions(record))

    def sample(name: str, seen: str) -> float | None:
        return metrics.registry.get_sample_value(f"scalerl_track_record_{name}", {"seen": seen})

    # Only the scored run counts in coverage and error: the void run's 0.9 would be a miss.
    assert sample("coverage", "0.5") == 1.0
    assert sample("median_error", "0.5") == pytest.approx(-0.02)
    assert sample("void", "0.5") == 1
    # The stopped run's one prediction, made at 20 % of its budget, is the latest by each
    # fraction: it counts as censored at all three, never as a hit or a miss.
    assert [sample("censored", s) for s in ("0.25", "0.5", "0.75")] == [1, 1, 1]
    assert sample("runs", "0.5") == 3
