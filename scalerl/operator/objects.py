"""What every object the operator makes for a run shares: its owner (labels, owner reference),
the images and the pods' security, the folders and ports of the processes, and a tracker's
environment."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from scalerl.operator import names
from scalerl.spec import API_VERSION, KIND, ScaleRLRun
from scalerl.tracking.records import RUN_UID_ENV

IMAGE_TAG = "0.1.0"
CONFIG_DIR = "/etc/scalerl"
SPEC_FILE = "run.yaml"
RUN_DIR = "/checkpoints"
KEYS_DIR = "/etc/scalerl/stream-keys"
CHANNEL_PORT = 5555
SYNC_PORT = 29500
RANKS_PORT = 29400  # the trainer ranks' own process group
METRICS_PORT = 9400
GPU = "nvidia.com/gpu"


# Our images run as this user (see the Dockerfiles); the pods say so, so that Kubernetes can
# check runAsNonRoot and the mounted Secret and volumes are readable by the group.
RUN_AS = 10001
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True)
class Images:
    trainer: str = f"scalerl/trainer:{IMAGE_TAG}"
    generator: str = f"scalerl/generator:{IMAGE_TAG}"
    fit: str = f"scalerl/operator:{IMAGE_TAG}"  # the fit needs scipy, not torch
    # The hf:// downloads (scalerl.operator.initializer says why this image).
    initializer: str = f"scalerl/operator:{IMAGE_TAG}"
    pull_secrets: tuple[str, ...] = ()  # for a private registry (the chart's imagePullSecrets)
    # The user (and group, and fsGroup) the pods run as; None leaves all three to the platform
    # (OpenShift's restricted-v2 assigns them from the namespace's range and refuses fixed ones).
    run_as: int | None = RUN_AS

    def for_run(self, run: ScaleRLRun) -> Images:
        """These images with the run's own pod user where its spec.podSecurity names one."""
        security = run.spec.pod_security
        return self if security is None else replace(self, run_as=security.run_as_user)

    def pod_fields(self) -> dict[str, Any]:
        if not self.pull_secrets:
            return {}
        return {"imagePullSecrets": [{"name": name} for name in self.pull_secrets]}

    def pod_security(self) -> dict[str, Any]:
        """Restricted Pod Security for every pod the operator makes. With an fsGroup, volumes are
        chowned to it only where their root does not match already (a model volume is not walked
        at every gang start)."""
        restricted = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        if self.run_as is None:
            return restricted
        ids = {"runAsUser": self.run_as, "runAsGroup": self.run_as, "fsGroup": self.run_as}
        return {**restricted, **ids, "fsGroupChangePolicy": "OnRootMismatch"}


@dataclass(frozen=True)
class Owner:
    """The run as the owner of its children."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, role: str, **extra_labels: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            # The run's identity labels last: nothing extra can change what selects a child.
            "labels": {**extra_labels, **names.labels(self.name, role)},
            "ownerReferences": [self.reference()],
        }


def tracking_environ(run: ScaleRLRun, owner: Owner, container: dict[str, Any]) -> None:
    """A container that logs to spec.tracking's trackers: the run's uid (the tracker run's
    identity, the same in every attempt) and the Secret's keys as its environment (tokens)."""
    tracking = run.spec.tracking
    if tracking is None or not tracking.trackers:
        return
    container["env"] = [*container.get("env", []), {"name": RUN_UID_ENV, "value": owner.uid}]
    if tracking.secret_ref is not None:
        container["envFrom"] = [{"secretRef": {"name": tracking.secret_ref.name}}]


def ports() -> list[tuple[str, int]]:
    return [
        ("channel", CHANNEL_PORT),
        ("sync", SYNC_PORT),
        ("ranks", RANKS_PORT),
        ("metrics", METRICS_PORT),
    ]
