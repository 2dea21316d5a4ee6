"""The fit Job's command, `scalerl fit --run`, on a real API server as the run's ServiceAccount,
with spec.tracking naming MLflow (a SQLite store): the fit lands in the trainer's tracker run (the
ScaleRLRun's uid), at the step of its last evaluation, read back by MLflow's own client; the same
fit made again (a Job's retried pod) adds no second point."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, RunAccount
from mlflow import MlflowClient

from scalerl.cli import main
from scalerl.tracking import RUN_UID_ENV, fit_job
from scalerl.tracking.to_mlflow import RUN_TAG

RUNS = "/apis/scalerl.dev/v1alpha1/namespaces"
A, B, C_MID, R0 = 0.6, 1.5, 100.0, 0.2


def curve(points: int) -> list[dict[str, Any]]:
    """Evaluations on the sigmoid, compute spaced evenly on the log axis, every 10 steps."""
    out = []
    for i in range(points):
        compute = 1000.0 ** (i / (points - 1))
        rate = R0 + (A - R0) / (1.0 + (C_MID / compute) ** B)
        out.append({"step": 10 * i, "computeHours": compute, "passRate": rate, "passRateSE": 0.01})
    return out


def series(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_the_fit_job_logs_the_fit_once_to_the_runs_tracker(
    plane: ControlPlane,
    ns: str,
    as_run: RunAccount,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's SQLite store keeps artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = {"mlflow": {"uri": uri, "experiment": "fits"}, "tensorboard": {"dir": "tb"}}
    as_run("r1", {"fit": {"minCompute": 0}, "tracking": tracking})
    code, run = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/r1")
    assert code == 200, run
    monkeypatch.setenv(RUN_UID_ENV, run["metadata"]["uid"])  # as the fit Job's pod has it
    status = {"evaluations": curve(12), "evaluationCount": 12}
    code, reply = plane.api_patch(f"{RUNS}/{ns}/scalerlruns/r1/status", {"status": status})
    assert code == 200, reply

    fit = ["fit", "--run", "r1", "--namespace", ns, "--bootstrap", "50", "--seed", "1"]
    assert main(fit) == 0
    assert "fit of step 110 logged to mlflow" in capsys.readouterr().err
    code, run = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/r1")
    prediction = run["status"]["prediction"]

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fits")
    assert experiment is not None
    (tracked,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run['metadata']['uid']}'"
    )
    run_id = tracked.info.run_id
    # The step of the last evaluation fitted (110); the numbers are the prediction's (which the
    # status keeps to six significant digits) and near the law the points were drawn from.
    ((step, a),) = series(client, run_id, "fit/A")
    assert step == 110
    assert a == pytest.approx(prediction["A"], rel=1e-5) and a == pytest.approx(A, abs=0.02)
    ((_, c_mid),) = series(client, run_id, "fit/C_mid")
    assert c_mid == pytest.approx(prediction["C_mid"], rel=1e-5)
    ((_, low),) = series(client, run_id, "fit/C_mid_low")
    ((_, high),) = series(client, run_id, "fit/C_mid_high")
    assert low <= c_mid <= high
    ((_, lo),) = series(client, run_id, "fit/A_low")
    assert lo == pytest.approx(prediction["A_interval"][0], rel=1e-5)
    ((_, at_budget),) = series(client, run_id, "fit/predicted_at_budget")
    assert at_budget == pytest.approx(prediction["predictedAtBudget"], rel=1e-5)
    assert tracked.data.tags["fit/confidence"] == prediction["confidence"]
    assert not (tmp_path / "tb").exists()  # TensorBoard's files belong on the run's volume

    # The same fit again (the Job's second pod after a failure): no second point at step 110.
    assert main(fit) == 0
    assert series(client, run_id, "fit/A") == [(110, a)]
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_a_tracker_that_is_down_costs_the_fit_job_a_warning_only(
    plane: ControlPlane,
    ns: str,
    as_run: RunAccount,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unused.getsockname()[1]}"
    as_run("r1", {"fit": {"minCompute": 0}, "tracking": {"mlflow": {"uri": dead}}})
    status = {"evaluations": curve(12), "evaluationCount": 12}
    code, reply = plane.api_patch(f"{RUNS}/{ns}/scalerlruns/r1/status", {"status": status})
    assert code == 200, reply
    monkeypatch.setattr(fit_job, "TIMEOUT_S", 2.0)  # the Job's wait for its trackers (60 s)

    started = time.monotonic()
    assert main(["fit", "--run", "r1", "--namespace", ns, "--bootstrap", "50"]) == 0
    assert time.monotonic() - started < 30
    code, run = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/r1")
    assert run["status"]["prediction"]["A"] == pytest.approx(A, abs=0.02)
    said = capsys.readouterr().err
    assert "fit of step 110 not logged to mlflow (see the warnings above)" in said
