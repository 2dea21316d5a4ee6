"""The cluster end of the status sink against the API emulator."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from history_rows import progress_at
from history_rows import scored as scores

from scalerl.kube import Kube
from scalerl.operator import crd
from scalerl.status import FileStatus
from scalerl.status.history import read_scores
from scalerl.status.kubernetes import KubernetesStatus, RunStatus

NS = "default"


@pytest.fixture
def run(k8s: Any) -> Any:
    k8s.install_crd(crd.build_crd())
    body = {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "r1", "namespace": NS},
        "spec": {"model": {"path": "/m"}, "data": {"train": "/d.jsonl"}, "fit": {"minCompute": 0}},
    }
    assert (
        k8s.api("POST", f"/apis/scalerl.dev/v1alpha1/namespaces/{NS}/scalerlruns", body).status
        == 201
    )
    return k8s


def sink(k8s: Any, run_dir: Path, keep: int = 300) -> KubernetesStatus:
    return KubernetesStatus(RunStatus(Kube.connect(k8s.url), NS, "r1"), FileStatus(run_dir), keep)


def stored(k8s: Any) -> dict[str, Any]:
    return dict(k8s.get("scalerlruns", "r1").get("status") or {})


def test_progress_and_evaluations_reach_the_status_and_the_volume(
    run: Any, tmp_path: Path, history_row
) -> None:
    status = sink(run, tmp_path)
    row = history_row(5, 0.5, 0.31)
    status.progress(progress_at(5, 0.5, train_pass_rate=0.4))
    status.evaluation(row, scores(0.31), [])
    got = stored(run)
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
        }
    ]
    assert got["evaluationCount"] == 1
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history == [row.to_dict()]  # the full row, every field the trainer wrote
    assert read_scores(tmp_path, 5) == scores(0.31)


def test_the_status_keeps_a_bounded_thinned_history(run: Any, tmp_path: Path, history_row) -> None:
    status = sink(run, tmp_path, keep=20)
    status.restore([history_row(i, 0.1 * (i + 1)).to_dict() for i in range(60)])
    status.evaluation(history_row(60, 6.1), scores(0.3), [])
    got = stored(run)
    assert len(got["evaluations"]) <= 20 and got["evaluationCount"] == 61
    assert got["evaluations"][0]["step"] == 0 and got["evaluations"][-1]["step"] == 60
    assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 61


def test_a_restore_drops_evaluations_after_the_checkpoint(
    run: Any, tmp_path: Path, history_row
) -> None:
    status = sink(run, tmp_path)
    for i in range(5):
        status.evaluation(history_row(i, 0.1 * (i + 1)), scores(0.3), [])
    status.restore([history_row(i, 0.1 * (i + 1)).to_dict() for i in range(3)])
    assert [e["step"] for e in stored(run)["evaluations"]] == [0, 1, 2]
    assert stored(run)["evaluationCount"] == 3


def test_conditions_are_set_without_losing_the_others(run: Any, tmp_path: Path) -> None:
    status = sink(run, tmp_path)
    status.condition("LearningSignal", True, "Learning", "groups with signal")
    status.condition("Ready", True, "Reconciled", "ok")
    status.condition("LearningSignal", False, "NoSignal", "50 steps without signal")
    conditions = {c["type"]: c for c in stored(run)["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["LearningSignal"]["status"] == "False"
    assert conditions["LearningSignal"]["reason"] == "NoSignal"


def test_the_sink_needs_only_get_and_patch_on_the_status(
    run: Any, tmp_path: Path, history_row
) -> None:
    before = len(run.requests)
    status = sink(run, tmp_path)
    status.progress(progress_at(1))
    status.evaluation(history_row(1, 0.1), scores(0.3), [])
    status.condition("LearningSignal", True, "Learning", "ok")
    calls = run.requests[before:]
    assert {(c.verb, c.rbac_resource, c.name) for c in calls} <= {
        ("get", "scalerlruns/status", "r1"),
        ("patch", "scalerlruns/status", "r1"),
    }


def test_an_unreachable_api_is_logged_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, history_row
) -> None:
    status = KubernetesStatus(
        RunStatus(Kube.connect("http://127.0.0.1:9"), NS, "r1", attempts=2), FileStatus(tmp_path)
    )
    with caplog.at_level(logging.WARNING, logger="scalerl.status.kubernetes"):
        status.progress(progress_at(1))
        status.evaluation(history_row(1, 0.1), scores(0.3), [])
        status.condition("Ready", True, "x", "y")
    assert len([r for r in caplog.records if "not written" in r.message]) == 3
    assert (tmp_path / "history.jsonl").exists()  # the volume still has everything
