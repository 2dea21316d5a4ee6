"""The prediction's rules that need no server: what the fit Job's event says it reads
(tests/cluster/test_fit_run.py runs the fit on a real server). When a run stops on its
prediction is `scalerl.fit.decision`'s rule: tests/fit/test_decision.py."""

from __future__ import annotations

import pytest

from scalerl.errors import SpecError
from scalerl.fit import sigmoid
from scalerl.operator.lifecycle import fitted
from scalerl.operator.prediction import describe, predict
from scalerl.spec import BudgetSpec, parse_run
from scalerl.status.kubernetes import status_evaluation


def run(spec: dict) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "r"},
        "spec": {"model": {"path": "m"}, "data": {"train": "t.jsonl"}, **spec},
    }


@pytest.mark.parametrize("points", [4, 7])
def test_stop_when_refuses_fewer_points_than_a_prediction_needs(points: int) -> None:
    with pytest.raises(SpecError) as err:
        parse_run(run({"budget": {"stopWhen": {"predictedABelow": 0.5, "minPoints": points}}}))
    assert "spec.budget.stopWhen.minPoints" in str(err.value)
    assert "8" in str(err.value)


def test_the_predicted_condition_says_why_a_fit_is_unchecked() -> None:
    prediction = {
        "A": 0.8, "A_interval": [0.7, 0.9], "C_mid": 0.02, "B": 1.5, "points": 10,
        "evaluations": 11, "predictedAtBudget": 0.75, "budgetLimit": "maxSteps",
        "budget": 0.071, "confidence": "Unchecked",
        "confidenceReason": "the half-run check needs 8 evaluations past the floor in the "
        "first half of the compute; it has 5",
    }  # fmt: skip
    said = describe(prediction, "process-hours")
    assert said.endswith(
        "(maxSteps, compute 0.071 process-hours); Unchecked: the half-run check needs 8 "
        "evaluations past the floor in the first half of the compute; it has 5"
    )
    assert "C_mid=0.02 process-hours" in said


def test_the_fit_event_says_when_it_reads_thinned_evaluations() -> None:
    assert fitted(20, 20) == "20 evaluations"
    assert fitted(300, 1001) == (
        "300 of 1001 evaluations (status.evaluations, thinned evenly on log compute)"
    )


def test_the_cluster_s_eta_is_wall_seconds_from_the_evaluations_times() -> None:
    # 21 evaluations as the trainer records them, 30 wall seconds per 0.5 GPU-hours of compute
    # (8 GPUs: 0.5 GPU-hours is 225 s of training, the rest evaluations and restarts).
    rows = [
        {"step": 10 * i, "compute": 0.5 * i, "time": 1.7e9 + 300.0 * i, "eval_samples": 512,
         "pass_rate": float(sigmoid(0.5 * i, 0.6, 1.5, 3.0, 0.1)), "pass_rate_se": 0.01}
        for i in range(21)
    ]  # fmt: skip
    evaluations = [status_evaluation(row) for row in rows]
    assert evaluations[1]["time"] == 1_700_000_300
    budget = BudgetSpec(max_steps=400, max_compute_hours=1e6)  # maxSteps: compute 20 at the end
    prediction = predict(evaluations, min_compute=0.0, budget=budget, units=8, bootstrap=50)
    assert prediction["budget"] == pytest.approx(20.0)
    assert prediction["etaSeconds"]["budget"] == pytest.approx((20.0 - 10.0) * 300.0 / 0.5)
    untimed = [{k: v for k, v in e.items() if k != "time"} for e in evaluations]
    prediction = predict(untimed, min_compute=0.0, budget=budget, units=8, bootstrap=50)
    assert prediction["etaSeconds"]["budget"] == pytest.approx(10.0 / 8 * 3600)
