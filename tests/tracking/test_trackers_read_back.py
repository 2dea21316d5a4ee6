"""What a run logs, read back by each tracker's own reader: MLflow (a SQLite store), TensorBoard
(event files) and W&B (offline files). The fit's numbers are a real fit's, compared with the
fit.json it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tracker_readers import (
    mlflow_run,
    mlflow_series,
    tensorboard_events,
    tensorboard_series,
    wandb_config,
    wandb_history,
)

from scalerl.fit.law import sigmoid
from scalerl.fit.report import FIT_FILE, PLOT_FILE, write_fit
from scalerl.spec import BudgetSpec, TrackingSpec
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers, names

STEPS = range(1, 9)
SPEC = {"model": {"path": "/models/base"}, "recipe": {"optimizer": {"lr": 5e-7}}}


def tracking(tmp_path: Path) -> TrackingSpec:
    return TrackingSpec.model_validate(
        {
            "mlflow": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "tests"},
            "tensorboard": {"dir": "tb"},
            "wandb": {"project": "tests", "mode": "offline"},
        }
    )


def sink(spec: TrackingSpec, run_dir: Path, role: str, resume_step: int | None) -> TrackerSink:
    run = TrackedRun.of("math-8b", "local", run_dir, role)
    return TrackerSink(build_trackers(spec, run), run, resume_step=resume_step)


def curve(points: int = 10) -> list[dict[str, float]]:
    """History rows on a known law, with a little deterministic noise."""
    compute = np.linspace(0.0, 40.0, points)
    rate = sigmoid(compute, A=0.7, B=1.5, C_mid=20.0, R0=0.1)
    noise = 0.005 * np.sin(np.arange(points))
    return [
        {"step": 10 * i, "compute": float(c), "pass_rate": float(r + e), "pass_rate_se": 0.01}
        for i, (c, r, e) in enumerate(zip(compute, rate, noise, strict=True))
    ]


def test_every_tracker_holds_the_steps_evaluations_fit_and_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts in ./mlruns
    spec, run_dir = tracking(tmp_path), tmp_path / "run"
    trainer = sink(spec, run_dir, "trainer", resume_step=0)
    trainer.params(SPEC)
    trainer.evaluation(0, {"eval/pass_rate": 0.1, "eval/pass_rate_se": 0.02})
    for step in STEPS:
        trainer.step(step, {"train/reward": step / 16, "train/loss": -step / 100})
    trainer.evaluation(8, {"eval/pass_rate": 0.4, "eval/pass_rate_se": 0.03})
    trainer.close(finished=True, timeout_s=60)

    history = curve()
    report = write_fit(history, run_dir, min_compute=0.0, budget=BudgetSpec(), units=1)
    fit = sink(spec, run_dir, "fit", resume_step=None)
    fit.fit(80, names.fit_metrics(report), names.fit_text(report), str(run_dir / PLOT_FILE))
    fit.close(finished=True, timeout_s=60)
    written = json.loads((run_dir / FIT_FILE).read_text())
    run_id = TrackedRun.of("math-8b", "local", run_dir, "trainer").id

    # MLflow: one run for both processes, found by the run's tag.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = mlflow_run(uri, "tests", run_id)
    assert mlflow_series(uri, run, "train/reward") == [(s, s / 16) for s in STEPS]
    assert mlflow_series(uri, run, "eval/pass_rate") == [(0, 0.1), (8, 0.4)]
    assert mlflow_series(uri, run, "fit/A") == [(80, written["A"])]
    assert mlflow_series(uri, run, "fit/A_low") == [(80, written["A_interval"][0])]
    assert mlflow_series(uri, run, "fit/C_mid_high") == [(80, written["C_mid_interval"][1])]
    assert mlflow_series(uri, run, "fit/predicted_at_budget") == [
        (80, written["predictedAtBudget"])
    ]
    assert run.data.params["model.path"] == "/models/base"
    assert float(run.data.params["recipe.optimizer.lr"]) == 5e-7
    assert run.data.tags["fit/confidence"] == written["confidence"]
    artifacts = [a.path for a in _client(uri).list_artifacts(run.info.run_id, "fit")]
    assert artifacts == [f"fit/{PLOT_FILE}"]

    # TensorBoard: one folder, read by TensorBoard's own reader (float32 values).
    events = tensorboard_events(run_dir / "tb" / "math-8b")
    assert tensorboard_series(events, "train/reward") == [
        (s, pytest.approx(s / 16, rel=1e-6)) for s in STEPS
    ]
    fits = tensorboard_events(run_dir / "tb" / "math-8b" / "fit")  # the fit's own process
    assert tensorboard_series(fits, "fit/A") == [(80, pytest.approx(written["A"], rel=1e-6))]
    assert [i.step for i in fits.Images(names.FIT_CURVE)] == [80]

    # W&B offline: the trainer's run, and the fit's beside it in the same group.
    rows = wandb_history(run_dir, run_id)
    assert [(r["_step"], r["train/reward"]) for r in rows if "train/reward" in r] == [
        (s, s / 16) for s in STEPS
    ]
    assert [r["_step"] for r in rows if "eval/pass_rate" in r] == [0, 8]
    assert wandb_config(run_dir, run_id)["model"] == {"path": "/models/base"}
    fit_rows = wandb_history(run_dir, f"{run_id}-fit")
    assert [(r["_step"], r["fit/A"]) for r in fit_rows] == [(80, written["A"])]


def _client(uri: str):  # type: ignore[no-untyped-def]
    from mlflow import MlflowClient

    return MlflowClient(uri)
