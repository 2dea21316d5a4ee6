"""A spec's secrets never reach a tracker: the run's parameters as MLflow (a SQLite store),
TensorBoard (event files) and W&B (offline files) keep them, and every byte those trackers and the
journal wrote, hold the masked spec (scalerl.redact), the rest of it as it was."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tracker_readers import mlflow_run, wandb_config

from scalerl.spec import TrackingSpec, parse_run
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers
from scalerl.tracking.records import Record

SECRETS = ["sk-SECRET-123", "hunter22", "tok-998877", "ghp_" + "Z" * 36, "pw-of-mlflow"]


def spec_with_secrets() -> dict[str, Any]:
    run = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "agent"},
            "spec": {
                "model": {"path": "/models/base"},
                "environment": {
                    "verifiers": {
                        "id": "judge-env",
                        "args": {
                            "api_key": "sk-SECRET-123",
                            "judge_url": "https://judge:hunter22@judge.example/v1?token=tok-998877",
                            "repo": "ghp_" + "Z" * 36,
                            "rows": 64,
                        },
                    }
                },
                "tracking": {"mlflow": {"uri": "https://bob:pw-of-mlflow@mlflow.example"}},
            },
        }
    )
    dumped: dict[str, Any] = run.spec.model_dump(by_alias=True, mode="json")
    return dumped


def test_no_tracker_and_no_file_holds_a_secret_of_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = TrackingSpec.model_validate(
        {
            "mlflow": {"uri": uri, "experiment": "tests"},
            "tensorboard": {"dir": "tb"},
            "wandb": {"project": "tests", "mode": "offline"},
        }
    )
    run_dir = tmp_path / "run"
    tracked = TrackedRun.of("agent", "local", run_dir, "trainer")
    sink = TrackerSink(build_trackers(tracking, tracked), tracked, resume_step=0)
    spec = spec_with_secrets()
    sink.params(spec)
    sink.step(1, {"train/reward": 0.5})
    sink.close(finished=True, timeout_s=60)
    assert all(d.delivered.has(Record("params", 0)) for d in sink.deliveries)

    # What each tracker holds: the masked values, and the rest of the spec unchanged.
    params = mlflow_run(uri, "tests", tracked.id).data.params
    assert params["environment.verifiers.args.api_key"] == "***"
    assert params["environment.verifiers.args.judge_url"] == (
        "https://***@judge.example/v1?token=***"
    )
    assert params["environment.verifiers.args.rows"] == "64"
    assert params["tracking.mlflow.uri"] == "https://***@mlflow.example"
    assert params["model.path"] == "/models/base"
    config = wandb_config(run_dir, tracked.id)
    assert config["environment"]["verifiers"]["args"]["api_key"] == "***"
    assert config["environment"]["verifiers"]["args"]["repo"] == "***"
    assert config["model"] == spec["model"]

    # Every byte written: the trackers' stores and files, the journal, and the logs.
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written)
    assert any("tfevents" in p.name for p in written)
    assert (run_dir / "tracking" / "trainer.jsonl") in written
    for path in written:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)
    for secret in SECRETS:
        assert secret not in caplog.text
