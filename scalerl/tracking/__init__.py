"""Experiment trackers: MLflow, TensorBoard, Weights & Biases and trackio, as `spec.tracking` names.

The trainer logs each step and evaluation, the fit (the local runner, or the fit Job) each fit,
all to one tracker run per ScaleRLRun (`TrackedRun`). Metric names: `scalerl.tracking.names`.
Delivery (bounded, retried, never in training's way): `scalerl.tracking.sink`. A tracker's
library is imported only when a run names it, so a run without tracking pays nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scalerl.errors import InputError
from scalerl.tracking.records import RUN_UID_ENV, TrackedRun
from scalerl.tracking.sink import Counter, Tracker, TrackerSink

if TYPE_CHECKING:
    from scalerl.spec import ScaleRLRun, TrackingSpec

__all__ = ["RUN_UID_ENV", "TrackedRun", "TrackerSink", "open_trackers"]

# tracker -> the package a user installs for it (`pip install 'scalerl[tracking]'` has the first
# three; trackio is not in the extra: see docs/trackers.md).
PACKAGES = {
    "mlflow": "mlflow-skinny",
    "tensorboard": "tensorboardX",
    "wandb": "wandb",
    "trackio": "trackio",
}


def build_trackers(spec: TrackingSpec, run: TrackedRun) -> list[Tracker]:
    """One tracker object per tracker the spec names (libraries imported here, when named)."""
    trackers: list[Tracker] = []
    try:
        if spec.mlflow is not None:
            from scalerl.tracking.to_mlflow import MlflowTracker

            trackers.append(MlflowTracker(spec.mlflow, run))
        if spec.tensorboard is not None:
            from scalerl.tracking.to_tensorboard import TensorboardTracker

            trackers.append(TensorboardTracker(spec.tensorboard, run))
        if spec.wandb is not None:
            from scalerl.tracking.to_wandb import WandbTracker

            trackers.append(WandbTracker(spec.wandb, run))
        if spec.trackio is not None:
            from scalerl.tracking.to_trackio import TrackioTracker

            trackers.append(TrackioTracker(spec.trackio, run))
    except ImportError as err:
        missing = err.name or str(err)
        wanted = [f"{name} (pip install {PACKAGES[name]})" for name in spec.trackers]
        raise InputError(
            f"spec.tracking names {', '.join(wanted)}, but {missing!r} is not installed here"
        ) from None
    return trackers


def open_trackers(
    run: ScaleRLRun,
    run_dir: Path,
    role: str,
    *,
    resume_step: int | None,
    on_dropped: Counter = lambda: None,
    on_failed: Counter = lambda: None,
) -> TrackerSink | None:
    """The sink of `role` ("trainer" or "fit") for `run`; None when the spec names no tracker.
    `resume_step`: the step the process resumed from (its checkpoint's), after which the
    journal's records are redone; None for a role that redoes nothing."""
    spec = run.spec.tracking
    if spec is None or not spec.trackers:
        return None
    tracked = TrackedRun.of(run.name, run.namespace, run_dir, role)
    trackers = build_trackers(spec, tracked)
    return TrackerSink(
        trackers, tracked, resume_step=resume_step, on_dropped=on_dropped, on_failed=on_failed
    )
