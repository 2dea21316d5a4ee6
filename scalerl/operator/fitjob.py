"""The fit Job: `scalerl fit` in a pod of its own, which reads status.evaluations, writes
status.prediction and exits."""

from __future__ import annotations

from typing import Any

from scalerl.operator import names
from scalerl.operator.objects import (
    CONTAINER_SECURITY,
    RUN_DIR,
    Images,
    Owner,
    tracking_environ,
)
from scalerl.spec import ScaleRLRun
from scalerl.tracking.records import RUN_DIR_ENV

FIT_TTL_S = 600  # finished fit Jobs expire; their result is in status.prediction
FIT_DEADLINE_S = 900


def fit_job(run: ScaleRLRun, owner: Owner, number: int, images: Images) -> dict[str, Any]:
    """The curve fit: reads status.evaluations, writes status.prediction, exits."""
    command = ["scalerl", "fit", "--run", owner.name, "--namespace", owner.namespace]
    container = {
        "name": names.ROLE_FIT,
        "image": images.fit,
        "command": command,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": CONTAINER_SECURITY,
    }
    tracking_environ(run, owner, container)  # it logs each fit as the trainer logs its steps
    pod_volumes = _run_folder(run, container)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": owner.metadata(names.fit_job(owner.name, number), names.ROLE_FIT),
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": FIT_DEADLINE_S,
            "ttlSecondsAfterFinished": FIT_TTL_S,
            "template": {
                "metadata": {"labels": names.labels(owner.name, names.ROLE_FIT)},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names.account(owner.name),
                    "containers": [container],
                    "securityContext": images.for_run(run).pod_security(),
                    **images.pod_fields(),
                    **pod_volumes,
                },
            },
        },
    }


def _run_folder(run: ScaleRLRun, container: dict[str, Any]) -> dict[str, Any]:
    """W&B offline writes files for `wandb sync` later: the Job mounts the run's folder of the
    claim, as the trainer does (RUN_DIR), and names it in SCALERL_RUN_DIR, so the fit's files
    land beside the trainer's (scalerl.tracking.fit_job). Nothing for any other run: the Job
    needs no volume then."""
    tracking, claim = run.spec.tracking, run.spec.checkpoint.claim_name
    if tracking is None or tracking.wandb is None or tracking.wandb.mode != "offline":
        return {}
    if claim is None:
        return {}  # no folder outlives the pod: the Job leaves W&B out, with a warning
    mount = {"name": "store", "mountPath": RUN_DIR, "subPath": f"runs/{run.name}"}
    container["volumeMounts"] = [mount]
    container["env"] = [*container.get("env", []), {"name": RUN_DIR_ENV, "value": RUN_DIR}]
    return {"volumes": [{"name": "store", "persistentVolumeClaim": {"claimName": claim}}]}
