"""The fit Job: `scalerl fit` in a pod of its own, which reads status.evaluations, writes
status.prediction and exits."""

from __future__ import annotations

from typing import Any

from scalerl.operator import names
from scalerl.operator.objects import CONTAINER_SECURITY, Images, Owner, tracking_environ
from scalerl.spec import ScaleRLRun

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
                },
            },
        },
    }
