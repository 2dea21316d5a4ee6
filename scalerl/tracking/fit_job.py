"""The fit Job's fit, to spec.tracking's trackers: what the local runner logs after each fit, on a
cluster (`scalerl fit --run`, in the operator's image).

The same tracker run as the trainer's (the ScaleRLRun's uid; the fit's W&B run `<uid>-fit`,
trackio's `<name>-fit`, as locally) at the step of the last evaluation fitted. Each tracker is
asked first whether it holds the fit's step already (a Job's retried pod, or a fit run again by
hand, sends nothing twice to MLflow; W&B itself takes no step twice).

Where the Job writes: W&B offline (spec.tracking.wandb.mode) writes files for `wandb sync`, so
they must outlive the pod: the operator mounts the run's folder of spec.checkpoint.claimName (as
the trainer has it) and names it in SCALERL_RUN_DIR; the fit's `offline-run-*-<uid>-fit` folder
goes to its `wandb/`, beside the trainer's, and the journal to its `tracking/`, as a local run
has them. A run without a claim has no folder that outlives the pod: W&B offline is left out with
a warning. Otherwise (no offline W&B) the Job has no volume, and its journal is a temporary
folder. TensorBoard is left out: its files belong to the trainer's folder. A tracker whose library
this image lacks is left out with a warning. The fit is logged after status.prediction is
written, for a bounded time; a tracker that is down loses the fit, never the prediction.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.tracking import PACKAGES, build_trackers, names
from scalerl.tracking.records import RUN_DIR_ENV, Record, TrackedRun
from scalerl.tracking.sink import TrackerSink

if TYPE_CHECKING:
    from scalerl.spec import ScaleRLRun, TrackingSpec

log = logging.getLogger("scalerl.tracking")

# tracker -> the module its adapter imports (a tracker whose module is missing is left out)
MODULES = {
    "mlflow": "mlflow",
    "tensorboard": "tensorboardX",
    "wandb": "wandb",
    "trackio": "trackio",
}
NOT_FROM_THE_JOB = {"tensorboard": "its files are on the run's volume, which the fit Job lacks"}
TIMEOUT_S = 60.0  # what the Job waits for its trackers at most (its deadline is longer)


def job_trackers(spec: TrackingSpec, run_dir: Path | None = None) -> TrackingSpec:
    """`spec` less the trackers the fit Job does not log to (each named in a warning); `run_dir`:
    the run's folder where the Job has it (module doc)."""
    left_out: dict[str, Any] = {}
    for name in spec.trackers:
        if name in NOT_FROM_THE_JOB:
            reason = NOT_FROM_THE_JOB[name]
        elif (
            name == "wandb"
            and spec.wandb is not None
            and spec.wandb.mode == "offline"
            and (run_dir is None)
        ):
            reason = (
                "its offline files would be lost with the Job's pod, which has no folder of the "
                "run (spec.checkpoint.claimName) to keep them for `wandb sync`"
            )
        elif importlib.util.find_spec(MODULES[name]) is None:
            reason = f"{PACKAGES[name]} is not installed in this image"
        else:
            continue
        log.warning("fit Job: the fit is not logged to %s: %s", name, reason)
        left_out[name] = None
    return spec.model_copy(update=left_out)


def log_fit(
    run: ScaleRLRun, uid: str, report: dict[str, Any], run_dir: Path | None = None
) -> dict[str, bool]:
    """Log `report` (fit.json's fields: the fit of the run's status.evaluations) to the run's
    trackers: for each tracker it tried, whether the tracker has the fit (one that is down
    within TIMEOUT_S does not; its warnings say why). `run_dir`: the run's folder, by default
    SCALERL_RUN_DIR's where the operator mounted it (module doc)."""
    if run.spec.tracking is None:
        return {}
    if run_dir is None and os.environ.get(RUN_DIR_ENV):
        run_dir = Path(os.environ[RUN_DIR_ENV])
    spec = job_trackers(run.spec.tracking, run_dir)
    if not spec.trackers:
        return {}
    fit = Record("fit", int(report.get("lastStep") or 0), names.fit_metrics(report))
    if run_dir is not None:
        return _log(spec, TrackedRun(uid, run.name, run.namespace, "fit", run_dir), fit, report)
    # A tracker still retrying past TIMEOUT_S may write its state there as it goes.
    with tempfile.TemporaryDirectory(prefix="scalerl-fit-", ignore_cleanup_errors=True) as folder:
        tracked = TrackedRun(uid, run.name, run.namespace, "fit", Path(folder))
        return _log(spec, tracked, fit, report)


def _log(
    spec: TrackingSpec, tracked: TrackedRun, fit: Record, report: dict[str, Any]
) -> dict[str, bool]:
    sink = TrackerSink(build_trackers(spec, tracked), tracked, resume_step=None, ask_first=True)
    sink.fit(fit.step, fit.metrics, names.fit_text(report), None)
    sink.close(finished=True, timeout_s=TIMEOUT_S)
    # A tracker has the fit once it took it and was closed: W&B writes what `log` took only as
    # its run finishes, so a delivery thread still closing past TIMEOUT_S has not written it yet.
    return {
        d.tracker.name: d.delivered.has(fit) and not d.thread.is_alive() for d in sink.deliveries
    }
