"""The fit Job's W&B offline files (scalerl.tracking.fit_job, scalerl.operator.fitjob): they land
in the run's folder on its volume, beside the trainer's, where `wandb sync` finds them; a run
with no volume gets a warning, never a "logged" line for files the pod takes with it."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from tracker_readers import wandb_history

from scalerl.operator.fitjob import fit_job
from scalerl.operator.objects import Images, Owner
from scalerl.spec import parse_run
from scalerl.tracking.fit_job import log_fit
from scalerl.tracking.records import RUN_DIR_ENV

OWNER = Owner("math-8b", "team-a", "0b5c-uid")
REPORT = {"A": 0.61, "B": 1.4, "C_mid": 12.5, "R0": 0.1, "lastStep": 60, "confidence": "OK"}


def run(checkpoint: dict[str, Any]) -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "math-8b", "namespace": "team-a", "uid": OWNER.uid},
            "spec": {
                "model": {"path": "/models/m"},
                "data": {"train": "/data/d.jsonl"},
                "checkpoint": checkpoint,
                "tracking": {"wandb": {"project": "rl", "mode": "offline"}},
            },
        }
    )


def test_the_fit_jobs_offline_files_land_in_the_run_folder_where_wandb_sync_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claimed = run({"claimName": "store"})
    job = fit_job(claimed, OWNER, 3, Images())
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    # The trainer's folder of the claim, named to the process where it is mounted.
    assert volume == {"name": "store", "persistentVolumeClaim": {"claimName": "store"}}
    assert mount == {"name": "store", "mountPath": "/checkpoints", "subPath": "runs/math-8b"}
    environ = {e["name"]: e["value"] for e in container["env"]}
    assert environ[RUN_DIR_ENV] == mount["mountPath"]

    # The Job's process, the mounted folder being tmp_path/run here.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(RUN_DIR_ENV, str(run_dir))
    monkeypatch.chdir(tmp_path)
    assert log_fit(claimed, OWNER.uid, REPORT) == {"wandb": True}
    rows = wandb_history(run_dir, f"{OWNER.uid}-fit")
    assert [(r["_step"], r["fit/A"], r["fit/C_mid"]) for r in rows] == [(60, 0.61, 12.5)]
    # `wandb sync`, run where the user has the folder, lists the fit's run as one to upload.
    listed = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run"],
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=120,
        env={"WANDB_MODE": "offline", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert f"{OWNER.uid}-fit" in listed.stdout + listed.stderr, listed


def test_without_a_volume_offline_wandb_is_left_out_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unclaimed = run({})
    pod = fit_job(unclaimed, OWNER, 3, Images())["spec"]["template"]["spec"]
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert log_fit(unclaimed, OWNER.uid, REPORT) == {}  # never "logged to wandb"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "not logged to wandb" in warned and "spec.checkpoint.claimName" in warned
    assert not list(tmp_path.rglob("offline-run-*"))


def test_online_wandb_needs_no_volume() -> None:
    online = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "math-8b", "namespace": "team-a"},
            "spec": {
                "model": {"path": "/models/m"},
                "data": {"train": "/data/d.jsonl"},
                "checkpoint": {"claimName": "store"},
                "tracking": {"wandb": {"project": "rl"}},
            },
        }
    )
    pod = fit_job(online, OWNER, 3, Images())["spec"]["template"]["spec"]
    assert "volumes" not in pod
