"""The fit Job's fit, to spec.tracking's trackers: what the local runner logs after each fit, on a
cluster (`scalerl fit --run`, in the operator's image).

The same tracker run as the trainer's (the ScaleRLRun's uid; the fit's W&B run `<uid>-fit`,
trackio's `<name>-fit`, as locally) at the step of the last evaluation fitted. The Job's pod has
no volume of the run: its journal is a temporary folder, so each tracker is asked first whether
it holds the fit's step already (a Job's retried pod, or a fit run again by hand, sends nothing
twice to MLflow; W&B itself takes no step twice). TensorBoard is left out: its files belong on
the run's volume, which the trainer writes and the Job does not mount. A tracker whose library
this image lacks is left out with a warning. The fit is logged after status.prediction is
written, for a bounded time; a tracker that is down loses the fit, never the prediction.
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.tracking import PACKAGES, build_trackers, names
from scalerl.tracking.records import Record, TrackedRun
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


def job_trackers(spec: TrackingSpec) -> TrackingSpec:
    """`spec` less the trackers the fit Job does not log to (each named in a warning)."""
    left_out: dict[str, Any] = {}
    for name in spec.trackers:
        if name in NOT_FROM_THE_JOB:
            reason = NOT_FROM_THE_JOB[name]
        elif importlib.util.find_spec(MODULES[name]) is None:
            reason = f"{PACKAGES[name]} is not installed in this image"
        else:
            continue
        log.warning("fit Job: the fit is not logged to %s: %s", name, reason)
        left_out[name] = None
    return spec.model_copy(update=left_out)


def log_fit(run: ScaleRLRun, uid: str, report: dict[str, Any]) -> dict[str, bool]:
    """Log `report` (fit.json's fields: the fit of the run's status.evaluations) to the run's
    trackers: for each tracker it tried, whether the tracker has the fit (one that is down
    within TIMEOUT_S does not; its warnings say why)."""
    if run.spec.tracking is None:
        return {}
    spec = job_trackers(run.spec.tracking)
    if not spec.trackers:
        return {}
    fit = Record("fit", int(report.get("lastStep") or 0), names.fit_metrics(report))
    # A tracker still retrying past TIMEOUT_S may write its state there as it goes.
    with tempfile.TemporaryDirectory(prefix="scalerl-fit-", ignore_cleanup_errors=True) as folder:
        tracked = TrackedRun(uid, run.name, run.namespace, "fit", Path(folder))
        sink = TrackerSink(build_trackers(spec, tracked), tracked, resume_step=None, ask_first=True)
        sink.fit(fit.step, fit.metrics, names.fit_text(report), None)
        sink.close(finished=True, timeout_s=TIMEOUT_S)
        return {d.tracker.name: d.delivered.has(fit) for d in sink.deliveries}
