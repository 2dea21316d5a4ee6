"""The cluster end of the status sink on a real API server, as trainer 0 uses it: with the run's
own ServiceAccount and the Role the operator gives it (get and patch on the run's status only),
every request authorized by the server's RBAC and counted in its audit log."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, RunAccount
from history_rows import history_row, progress_at
from history_rows import scored as scores

from scalerl.kube import Kube, KubeError
from scalerl.status import FileStatus
from scalerl.status.history import read_scores
from scalerl.status.kubernetes import KubernetesStatus, RunStatus

RUN = "r1"


def sink(ns: str, run_dir: Path, keep: int = 300) -> KubernetesStatus:
    return KubernetesStatus(RunStatus(Kube.connect(), ns, RUN), FileStatus(run_dir), keep)


@pytest.fixture(autouse=True)
def run_sa(as_run: RunAccount) -> str:
    """The run r1, and this process connected as its ServiceAccount."""
    return as_run(RUN, {"fit": {"minCompute": 0}})


def stored(plane: ControlPlane, ns: str) -> dict[str, Any]:
    code, run = plane.api("GET", f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns/{RUN}")
    assert code == 200, run
    return dict(run.get("status") or {})


def test_progress_and_evaluations_reach_the_status_and_the_volume(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    status = sink(ns, tmp_path / "run")
    row = history_row(5, 0.5, 0.31)
    status.progress(progress_at(5, 0.5, train_pass_rate=0.4))
    status.evaluation(row, scores(0.31), [])
    got = stored(plane, ns)
    assert got["progress"]["step"] == 5 and got["progress"]["evalPassRate"] == 0.31
    assert got["progress"]["trainPassRate"] == 0.4
    se = float(f"{row.pass_rate_se:.6g}")
    assert got["evaluations"] == [
        {
            "step": 5,
            "computeHours": 0.5,
            "passRate": 0.31,
            "passRateSE": se,
            "samples": 100,
            "truncationRate": 0.0,
            "time": 1700000005,  # the evaluation's end (unix s), the ETA's wall clock
        }
    ]
    assert got["evaluationCount"] == 1
    lines = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [row.to_dict()]
    assert read_scores(tmp_path / "run", 5) == scores(0.31)


def test_the_trainer_reads_the_pool_size_kubectl_scale_asks_for_from_its_own_writes(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    """`kubectl scale srl/r1 --replicas=3` (the CRD's scale subresource) reaches trainer 0 with
    no request of its own: the run each status write answers with holds the spec."""
    status = sink(ns, tmp_path / "run")
    assert status.desired_generators() is None  # nothing written yet
    status.progress(progress_at(1, 0.1))
    assert status.desired_generators() == 8  # the CRD's default
    plane.kubectl("scale", f"--namespace={ns}", f"scalerlrun/{RUN}", "--replicas=3")
    spec = plane.api("GET", f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns/{RUN}")[1]
    assert spec["spec"]["generators"]["replicas"] == 3
    status.progress(progress_at(2, 0.2))
    assert status.desired_generators() == 3


def test_the_status_keeps_a_bounded_thinned_history(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    status = sink(ns, tmp_path, keep=20)
    status.restore([history_row(i, 0.1 * (i + 1)).to_dict() for i in range(60)])
    status.evaluation(history_row(60, 6.1), scores(0.3), [])
    got = stored(plane, ns)
    assert len(got["evaluations"]) <= 20 and got["evaluationCount"] == 61
    assert got["evaluations"][0]["step"] == 0 and got["evaluations"][-1]["step"] == 60
    assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 61


def test_a_restore_drops_evaluations_after_the_checkpoint(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    status = sink(ns, tmp_path)
    for i in range(5):
        status.evaluation(history_row(i, 0.1 * (i + 1)), scores(0.3), [])
    status.restore([history_row(i, 0.1 * (i + 1)).to_dict() for i in range(3)])
    assert [e["step"] for e in stored(plane, ns)["evaluations"]] == [0, 1, 2]
    assert stored(plane, ns)["evaluationCount"] == 3


def test_an_evaluation_with_a_number_json_cannot_carry_still_reaches_the_status(
    plane: ControlPlane, ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON has no NaN or Infinity, and a real server answers 400 to a body that holds one: the
    field is left out (an evaluation without its compute or pass rate has no place on the curve
    and only history.jsonl keeps it), a warning names it, and later evaluations still arrive."""
    status = sink(ns, tmp_path)
    no_se = replace(history_row(5, 0.5), pass_rate_se=math.nan)
    no_compute = replace(history_row(6, 0.6), compute=math.inf)
    with caplog.at_level(logging.WARNING, logger="scalerl.status.kubernetes"):
        for row in (no_se, no_compute, history_row(7, 0.7)):
            status.evaluation(row, scores(0.3), [])
    got = stored(plane, ns)
    assert [e["step"] for e in got["evaluations"]] == [5, 7]
    assert "passRateSE" not in got["evaluations"][0]
    assert got["evaluationCount"] == 2
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "passRateSE" in said and "computeHours" in said and "not written" not in said
    assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 3


def test_conditions_are_set_without_losing_the_others(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    status = sink(ns, tmp_path)
    status.condition("LearningSignal", True, "Learning", "groups with signal")
    status.condition("Ready", True, "Reconciled", "ok")
    status.condition("LearningSignal", False, "NoSignal", "50 steps without signal")
    conditions = {c["type"]: c for c in stored(plane, ns)["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["LearningSignal"]["status"] == "False"
    assert conditions["LearningSignal"]["reason"] == "NoSignal"


def test_a_generator_given_up_is_listed_for_the_operator_and_kept_on_the_volume(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    """Trainer 0 gave generators up: each that named its pod (host) is listed in
    status.generatorsGivenUp, beside what is there, for the operator to delete its pod; the
    volume keeps every one (gave-up.jsonl)."""
    status = sink(ns, tmp_path)
    status.gave_up(1, 42, "r1-generator-1-abcde", "no rollouts for 300 s")
    status.gave_up(0, 43, "r1-generator-0-fghij", "it did not join")
    status.gave_up(2, None, None, "said no hello")  # no pod to name: the volume only
    assert stored(plane, ns)["generatorsGivenUp"] == [
        {"index": 1, "pod": "r1-generator-1-abcde", "reason": "no rollouts for 300 s"},
        {"index": 0, "pod": "r1-generator-0-fghij", "reason": "it did not join"},
    ]
    lines = (tmp_path / "gave-up.jsonl").read_text().splitlines()
    assert [json.loads(line)["role"] for line in lines] == [
        "generator-1", "generator-0", "generator-2",
    ]  # fmt: skip


def test_the_sink_needs_only_get_and_patch_on_the_runs_status(
    plane: ControlPlane, ns: str, tmp_path: Path, run_sa: str
) -> None:
    status = sink(ns, tmp_path)
    status.progress(progress_at(1))
    status.evaluation(history_row(1, 0.1), scores(0.3), [])
    status.condition("LearningSignal", True, "Learning", "ok")
    mine = [e for e in plane.audit() if e["user"]["username"] == run_sa]
    assert mine, "the audit log shows no request of the run's ServiceAccount"
    assert {e["responseStatus"]["code"] for e in mine} <= {200}, "the server refused a request"
    seen = {
        (e["verb"], e["objectRef"]["resource"], e["objectRef"].get("subresource")) for e in mine
    }
    assert seen == {("get", "scalerlruns", "status"), ("patch", "scalerlruns", "status")}


def test_the_runs_service_account_may_not_touch_anything_else(plane: ControlPlane, ns: str) -> None:
    kube = Kube.connect()
    code = kube_status(lambda: kube.get("scalerl.dev/v1alpha1", "ScaleRLRun", ns, RUN))
    assert code == 403  # the run itself (its spec): not the sink's business
    code = kube_status(
        lambda: kube.patch("scalerl.dev/v1alpha1", "ScaleRLRun", ns, RUN, {"spec": {"seed": 1}})
    )
    assert code == 403


def kube_status(call: Any) -> int:
    try:
        call()
    except KubeError as err:
        return err.status
    return 200


def test_an_unreachable_api_is_logged_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    status = KubernetesStatus(
        RunStatus(Kube.connect("http://127.0.0.1:9"), "default", RUN, attempts=2),
        FileStatus(tmp_path),
    )
    with caplog.at_level(logging.WARNING, logger="scalerl.status.kubernetes"):
        status.progress(progress_at(1))
        status.evaluation(history_row(1, 0.1), scores(0.3), [])
        status.condition("Ready", True, "x", "y")
    assert len([r for r in caplog.records if "not written" in r.message]) == 3
    assert (tmp_path / "history.jsonl").exists()  # the volume still has everything
