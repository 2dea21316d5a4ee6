"""`scalerl fit --run NAME --namespace NS`, the fit Job's command, against the API emulator."""

from __future__ import annotations

from typing import Any

import pytest
from harness import NS, condition, create, patch_run_status, run_manifest, status

from scalerl.cli import main
from scalerl.operator import crd
from scalerl.operator.lifecycle import fitted
from scalerl.operator.prediction import stop_reason
from scalerl.spec import BudgetSpec

A, B, C_MID, R0 = 0.6, 1.5, 100.0, 0.2


def curve(points: int) -> list[dict[str, Any]]:
    """Evaluations on the sigmoid of the paper, compute spaced evenly on the log axis."""
    out = []
    for i in range(points):
        compute = 1.0 * 1000.0 ** (i / max(points - 1, 1))
        rate = R0 + (A - R0) / (1.0 + (C_MID / compute) ** B)
        out.append({"step": 10 * i, "computeHours": compute, "passRate": rate})
    return out


@pytest.fixture
def cluster(k8s: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    k8s.install_crd(crd.build_crd())
    monkeypatch.setenv("KUBECONFIG", str(k8s.kubeconfig))  # the command connects as kubectl
    create(k8s, run_manifest(budget={"maxComputeHours": 5000.0}))
    return k8s


def fit(*extra: str) -> int:
    return main(["fit", "--run", "r1", "--namespace", NS, "--bootstrap", "40", *extra])


def test_the_fit_writes_the_prediction_and_a_predicted_condition(cluster: Any) -> None:
    patch_run_status(cluster, {"evaluations": curve(20), "evaluationCount": 20})
    assert fit() == 0
    prediction = status(cluster)["prediction"]
    assert prediction["A"] == pytest.approx(A, abs=0.02)
    assert prediction["C_mid"] == pytest.approx(C_MID, rel=0.15)
    assert prediction["points"] == 20
    assert prediction["A_interval"][0] <= prediction["A"] <= prediction["A_interval"][1]
    assert (prediction["budget"], prediction["budgetLimit"]) == (5000.0, "maxComputeHours")
    assert prediction["predictedAtBudget"] == pytest.approx(A, abs=0.03)
    assert prediction["evaluations"] == 20
    predicted = condition(cluster, "Predicted")
    assert predicted["status"] == "True" and predicted["reason"] == "Fitted"


def test_the_prediction_is_at_max_steps_when_the_run_gets_there_first(cluster: Any) -> None:
    # The last of 20 evaluations: step 190 at compute 1000, so maxSteps 380 ends the run at
    # compute 2000, before maxComputeHours 5000.
    patch_run_status(cluster, {"evaluations": curve(20), "evaluationCount": 20})
    cluster.patch("scalerlruns", "r1", {"spec": {"budget": {"maxSteps": 380}}})
    assert fit() == 0
    prediction = status(cluster)["prediction"]
    assert (prediction["budget"], prediction["budgetLimit"]) == (2000.0, "maxSteps")
    law = R0 + (A - R0) / (1.0 + (C_MID / 2000.0) ** B)
    assert prediction["predictedAtBudget"] == pytest.approx(law, abs=0.03)


def test_a_fit_that_cannot_be_made_keeps_the_previous_prediction(cluster: Any) -> None:
    patch_run_status(cluster, {"evaluations": curve(20), "evaluationCount": 20})
    assert fit() == 0
    before = status(cluster)["prediction"]
    patch_run_status(cluster, {"evaluations": curve(2), "evaluationCount": 2})
    assert fit() == 0
    assert status(cluster)["prediction"] == before
    predicted = condition(cluster, "Predicted")
    assert predicted["status"] == "False" and predicted["reason"] == "FitFailed"
    assert "point" in predicted["message"]


def test_a_run_that_is_not_there_exits_2(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--run", "nope", "--namespace", NS]) == 2
    assert "nope" in capsys.readouterr().err


def test_fit_prints_json(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    patch_run_status(cluster, {"evaluations": curve(12), "evaluationCount": 12})
    assert fit("--json") == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"A", "B", "C_mid", "R0", "A_interval", "points"} <= set(printed)


@pytest.mark.parametrize(
    ("interval", "points", "stops"),
    [([0.30, 0.40], 8, True), ([0.30, 0.55], 8, False), ([0.30, 0.40], 7, False)],
)
def test_the_stop_rule_needs_the_whole_interval_below_and_enough_points(
    interval: list[float], points: int, stops: bool
) -> None:
    budget = BudgetSpec.model_validate({"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}})
    prediction = {"A": 0.35, "A_interval": interval, "points": points}
    assert (stop_reason(budget, prediction) is not None) == stops
    assert stop_reason(BudgetSpec(), prediction) is None


def test_the_fit_event_says_when_it_reads_thinned_evaluations() -> None:
    assert fitted(20, 20) == "20 evaluations"
    assert fitted(300, 1001) == (
        "300 of 1001 evaluations (status.evaluations, thinned evenly on log compute)"
    )
