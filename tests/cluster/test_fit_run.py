"""`scalerl fit --run NAME --namespace NS`, the fit Job's command, on a real API server, connected
as the run's own ServiceAccount as the fit Job's pod is (its Role: get and patch the run's status);
and the fit Job itself, as the operator makes it, run by the test kubelet in the operator's image
(built with Podman from this checkout: containers.py).
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

import containers
import pytest
import yaml
from controlplane import ControlPlane, RunAccount
from kubelet import Kubelet, printing_logs_on_failure
from runs import wait_for

from scalerl.cli import main
from scalerl.operator import manifests
from scalerl.operator.manifests import Images, Owner
from scalerl.spec import parse_run

A, B, C_MID, R0 = 0.6, 1.5, 100.0, 0.2
SE = 0.01  # each evaluation's standard error, as trainer 0 reports it
RUNS = "/apis/scalerl.dev/v1alpha1/namespaces"


def curve(points: int) -> list[dict[str, Any]]:
    """Evaluations on the sigmoid of the paper, compute spaced evenly on the log axis."""
    out = []
    for i in range(points):
        compute = 1.0 * 1000.0 ** (i / max(points - 1, 1))
        rate = R0 + (A - R0) / (1.0 + (C_MID / compute) ** B)
        out.append({"step": 10 * i, "computeHours": compute, "passRate": rate, "passRateSE": SE})
    return out


@pytest.fixture(autouse=True)
def run(as_run: RunAccount) -> str:
    return as_run("r1", {"fit": {"minCompute": 0}, "budget": {"maxComputeHours": 5000.0}})


def patch(plane: ControlPlane, ns: str, body: dict[str, Any], sub: str = "") -> None:
    """As the admin: play trainer 0 (the status) or a user (the spec)."""
    code, reply = plane.api_patch(f"{RUNS}/{ns}/scalerlruns/r1{sub}", body)
    assert code == 200, reply


def evaluations(plane: ControlPlane, ns: str, points: int) -> None:
    status = {"evaluations": curve(points), "evaluationCount": points}
    patch(plane, ns, {"status": status}, "/status")


def status(plane: ControlPlane, ns: str) -> dict[str, Any]:
    code, run = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/r1")
    assert code == 200, run
    return dict(run.get("status") or {})


def condition(plane: ControlPlane, ns: str, type_: str) -> dict[str, Any]:
    return next(c for c in status(plane, ns)["conditions"] if c["type"] == type_)


def fit(ns: str, *extra: str) -> int:
    return main(["fit", "--run", "r1", "--namespace", ns, "--bootstrap", "50", *extra])


def test_the_fit_writes_the_prediction_and_a_predicted_condition(
    plane: ControlPlane, ns: str
) -> None:
    evaluations(plane, ns, 20)
    assert fit(ns) == 0
    prediction = status(plane, ns)["prediction"]
    assert prediction["A"] == pytest.approx(A, abs=0.02)
    assert prediction["C_mid"] == pytest.approx(C_MID, rel=0.15)
    assert prediction["points"] == 20
    assert prediction["A_interval"][0] <= prediction["A"] <= prediction["A_interval"][1]
    assert (prediction["budget"], prediction["budgetLimit"]) == (5000.0, "maxComputeHours")
    assert prediction["predictedAtBudget"] == pytest.approx(A, abs=0.03)
    # What an evaluation at the end will read: one evaluation's noise around the curve (the
    # normal quantiles of its standard error), widened by the curves that points this noisy
    # cannot tell from the fitted one (at most one evaluation's band again), and by the run's
    # measured drift five times past the last of them (scalerl.fit.drift), whose figures the
    # status carries (stored as the schema has them: nothing pruned).
    lo, hi = prediction["predictedAtBudgetInterval"]
    assert lo < R0 + (A - R0) / (1.0 + (C_MID / 5000.0) ** B) < hi
    z = statistics.NormalDist().inv_cdf(0.975)
    one_evaluation = 2 * z * SE
    drift = prediction["drift"]
    assert set(drift) == {"rate", "spread", "rateSe", "origins"} and drift["origins"] >= 2
    last = max(e["computeHours"] for e in status(plane, ns)["evaluations"])
    widening = 2 * z * math.hypot(drift["spread"], drift["rateSe"]) * math.log(5000.0 / last)
    assert one_evaluation * 0.95 <= hi - lo <= 2 * one_evaluation + widening
    assert prediction["evaluations"] == 20
    assert prediction["confidence"] == "OK" and prediction["backtest"]["inside"] is True
    predicted = condition(plane, ns, "Predicted")
    assert predicted["status"] == "True" and predicted["reason"] == "Fitted"


def test_a_run_off_the_law_is_told_its_prediction_is_a_misfit(plane: ControlPlane, ns: str) -> None:
    # A run whose pass rate climbs straight in compute (the demo's does): the law fitted to its
    # first half bends too early, and the last evaluation reads above that fit's interval.
    straight = [
        {"step": 10 * i, "computeHours": 50.0 * i, "passRate": 0.18 + 0.0365 * i, "passRateSE": SE}
        for i in range(21)
    ]
    patch(plane, ns, {"status": {"evaluations": straight, "evaluationCount": 21}}, "/status")
    assert fit(ns) == 0
    prediction = status(plane, ns)["prediction"]
    test = prediction["backtest"]  # stored as the schema has it: nothing pruned
    assert set(test) == {
        "fittedOn",
        "compute",
        "predicted",
        "interval",
        "actual",
        "error",
        "inside",
        "law",
    }
    assert (test["fittedOn"], test["compute"]) == (11, 1000.0)
    assert test["actual"] == pytest.approx(0.91)
    assert test["interval"][1] < 0.9 and test["inside"] is False
    # The law alone missed it too: lawCheck says so beside the forecast's confidence.
    assert test["law"]["interval"][1] < 0.9 and test["law"]["inside"] is False
    assert prediction["lawCheck"] == "Misses"
    assert prediction["confidence"] == "Misfit"
    predicted = condition(plane, ns, "Predicted")
    assert "Misfit: fitted on the first half of the compute" in predicted["message"]
    assert "Misfit" in plane.kubectl("get", "srl", "r1", "-n", ns)


def test_the_prediction_is_at_max_steps_when_the_run_gets_there_first(
    plane: ControlPlane, ns: str
) -> None:
    # The last of 20 evaluations: step 190 at compute 1000, so maxSteps 380 ends the run at
    # compute 2000, before maxComputeHours 5000.
    evaluations(plane, ns, 20)
    patch(plane, ns, {"spec": {"budget": {"maxSteps": 380}}})
    assert fit(ns) == 0
    prediction = status(plane, ns)["prediction"]
    assert (prediction["budget"], prediction["budgetLimit"]) == (2000.0, "maxSteps")
    law = R0 + (A - R0) / (1.0 + (C_MID / 2000.0) ** B)
    assert prediction["predictedAtBudget"] == pytest.approx(law, abs=0.03)


def test_a_fit_that_cannot_be_made_keeps_the_previous_prediction(
    plane: ControlPlane, ns: str
) -> None:
    evaluations(plane, ns, 20)
    assert fit(ns) == 0
    before = status(plane, ns)["prediction"]
    evaluations(plane, ns, 2)
    assert fit(ns) == 0
    assert status(plane, ns)["prediction"] == before
    predicted = condition(plane, ns, "Predicted")
    assert predicted["status"] == "False" and predicted["reason"] == "FitFailed"
    assert "point" in predicted["message"]


def test_a_run_that_is_not_there_exits_2(ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--run", "nope", "--namespace", ns]) == 2
    assert "nope" in capsys.readouterr().err


def test_fit_prints_json(plane: ControlPlane, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    evaluations(plane, ns, 12)
    assert fit(ns, "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"A", "B", "C_mid", "R0", "A_interval", "points"} <= set(printed)


@pytest.mark.slow
def test_the_fit_job_runs_in_the_operator_image(plane: ControlPlane, ns: str) -> None:
    """The Job the operator makes, its pod run with Podman in the image `make images` builds: the
    prediction it writes is the one the same fit makes in this process."""
    image = containers.operator_image()
    evaluations(plane, ns, 20)
    code, body = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/r1")
    assert code == 200, body
    run = parse_run(body)
    job = manifests.fit_job(run, Owner("r1", ns, body["metadata"]["uid"]), 1, Images())
    with (
        Kubelet(plane, ns, images={Images().fit: image}) as kubelet,
        printing_logs_on_failure(kubelet),
    ):
        plane.kubectl("create", "-f", "-", input=yaml.safe_dump(job))
        wait_for(lambda: kubelet.ended, "the fit pod ended", timeout_s=180)
        ((pod, code),) = kubelet.ended.items()
        assert code == 0, kubelet.log(pod)
        assert kubelet.in_image(pod) == image
    in_image = status(plane, ns)["prediction"]
    assert main(job["spec"]["template"]["spec"]["containers"][0]["command"][1:]) == 0  # here
    here = status(plane, ns)["prediction"]
    for key in ("A", "B", "C_mid", "points", "predictedAtBudget"):
        assert in_image[key] == pytest.approx(here[key], rel=1e-6), key
