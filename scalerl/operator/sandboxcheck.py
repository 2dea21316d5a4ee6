"""The sandbox check: a run that scores model-written code (`reward: code`) makes one sandbox in
a pod like the ones that will run the programs before its gang exists, so that a cluster that
cannot isolate them fails the run at once (`SandboxUnavailable`, with the check's own words)
instead of running them unsandboxed, or failing only once every GPU pod has started.

"Like the ones that will run the programs": the pods of the role that scores code (the
generators; a colocated run's one role), with their image, pod security, scheduling (runtime
class, node selector, tolerations) and, where `data.code.unmaskedProc` asks for them, a user
namespace of its own and an unmasked /proc (`code_pod_fields`, which those pods get too). It asks
for no GPU, mounts nothing and holds no ServiceAccount token: it runs `scalerl sandbox-check`,
which makes one sandbox, runs a program in it that looks for the pod's secrets and the network
(`scalerl.sandbox.selftest`), and exits 3 with the reason where no sandbox can be made or the
program reached anything (unless the spec allows plain processes by name,
`data.code.unsafeAllowPlain`). What it says is its termination message (the file it writes; its
log's tail where it failed, `FallbackToLogsOnError`), which the run's status quotes.

The Job is owned by the run, kept while it lives (its log says which sandbox the pods get) and
replaced when what it checks changes (`key`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from scalerl.kube import Kube
from scalerl.operator import children, names
from scalerl.operator.codepods import code_pod_fields, scoring_role
from scalerl.operator.objects import CONTAINER_SECURITY, Images, Owner
from scalerl.spec import ReplicaSpec, ScaleRLRun

CONDITION = "SandboxReady"
CHECKING, READY, UNAVAILABLE = "Checking", "Checked", "SandboxUnavailable"
KEY_ANNOTATION = "scalerl.dev/sandbox-check"  # what a Job checked (`key`)
ROLE = names.ROLE_SANDBOX_CHECK
COMMAND = ["scalerl", "sandbox-check"]
# Where a message is longer than this, its end is kept: a kubelet keeps 2,048 bytes of a log.
MESSAGE_CHARS = 2048
ERROR = "error: "  # how the CLI starts the line of an error it reports (scalerl.errors.report)


def key(run: ScaleRLRun, images: Images) -> str:
    """What a check depends on, in short: the scoring pods' image and settings."""
    role, replicas = scoring_role(run)
    checked = {
        "image": _image(run, images),
        "pod": _pod_spec(run, images, replicas),
        "allowPlain": run.spec.data.code.unsafe_allow_plain,
        "role": role,
    }
    return hashlib.sha256(json.dumps(checked, sort_keys=True).encode()).hexdigest()[:16]


def job(run: ScaleRLRun, owner: Owner, images: Images) -> dict[str, Any]:
    """The sandbox check Job of `run` (one that scores code: `codepods.scores_code`)."""
    _, replicas = scoring_role(run)
    metadata = owner.metadata(names.sandbox_check(owner.name), ROLE)
    metadata["annotations"] = {KEY_ANNOTATION: key(run, images)}
    pod = _pod_spec(run, images, replicas)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,  # a refusal is the cluster's answer, not a flake to retry
            "template": {"metadata": {"labels": names.labels(owner.name, ROLE)}, "spec": pod},
        },
    }


def _image(run: ScaleRLRun, images: Images) -> str:
    """The scoring role's image: the spec's, else the generator image (the one with the
    sandbox's bubblewrap, and the colocated role's)."""
    _, replicas = scoring_role(run)
    return replicas.image or images.generator


def _pod_spec(run: ScaleRLRun, images: Images, replicas: ReplicaSpec) -> dict[str, Any]:
    pod_fields, container_security = code_pod_fields(run)
    command = [*COMMAND, *(["--allow-plain"] if run.spec.data.code.unsafe_allow_plain else [])]
    container = {
        "name": ROLE,
        "image": _image(run, images),
        "command": command,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "securityContext": {**CONTAINER_SECURITY, **container_security},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # the check calls nothing, as a generator
        "securityContext": images.for_run(run).pod_security(),
        **images.pod_fields(),
        **replicas.scheduling.over(run.spec.scheduling).pod_fields(),
        **pod_fields,
        "containers": [container],
    }


@dataclass(frozen=True)
class Verdict:
    """Where the check stands: `reason` (Checking, Checked or SandboxUnavailable), the line a
    user reads, and whether this call created the Job."""

    reason: str
    message: str
    created: bool = False


def ensure(kube: Kube, run: ScaleRLRun, owner: Owner, images: Images) -> Verdict:
    """The run's sandbox check Job, created where missing (replaced where it checked other
    settings), and what it found."""
    job_name = names.sandbox_check(owner.name)
    current = kube.find("batch/v1", "Job", owner.namespace, job_name)
    if current is not None and _key_of(current) != key(run, images):
        kube.delete("batch/v1", "Job", owner.namespace, job_name)
        current = None
    role, _ = scoring_role(run)
    checking = (
        f"making a sandbox for model-written code in a {role} pod's settings (Job {job_name})"
    )
    if current is None:
        created = kube.create(job(run, owner, images)) is not None
        return Verdict(CHECKING, checking, created=created)
    conditions = {c.get("type"): c for c in (current.get("status") or {}).get("conditions") or []}
    if (conditions.get("Complete") or {}).get("status") == "True":
        said = _ended(kube, owner, job_name, succeeded=True)
        made = f"a {role} pod's settings make a sandbox (Job {job_name})"
        return Verdict(READY, f"{made}: {said}" if said else made)
    failed = (conditions.get("Failed") or {}).get("status") == "True"
    # A pod the cluster refuses to create (Pod Security refusing an unmasked /proc, a quota)
    # leaves the Job waiting forever: that refusal is the check's answer too.
    refusal = None if failed else children.refused(kube, owner.namespace, {_uid(current)})
    if failed or refusal is not None:
        said = refusal or _ended(kube, owner, job_name) or conditions["Failed"].get("message", "")
        return Verdict(
            UNAVAILABLE,
            f"no sandbox for model-written code in a {role} pod's settings (Job {job_name}): "
            f"{said}; change the settings (docs/cluster.md, 'Model-written code') and create "
            "the run again",
        )
    return Verdict(CHECKING, checking)


def _uid(job_obj: dict[str, Any]) -> str:
    return str(job_obj["metadata"].get("uid", ""))


def _key_of(job_obj: dict[str, Any]) -> str | None:
    return (job_obj["metadata"].get("annotations") or {}).get(KEY_ANNOTATION)


def _ended(kube: Kube, owner: Owner, job_name: str, succeeded: bool = False) -> str:
    """The check's own words: its container's termination message (what it wrote, which
    sandbox and what a program in it reached; where it failed, its log's tail, `error:` lines
    first), else, where it failed, its exit code."""
    for pod in kube.list("v1", "Pod", owner.namespace, {"job-name": job_name}):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated") or {}
            if not ended or (ended.get("exitCode") == 0) != succeeded:
                continue
            text = (ended.get("message") or "").strip()
            if succeeded:
                return "; ".join(text.splitlines())[-MESSAGE_CHARS:]
            lines = text.splitlines()
            said = "; ".join(line[len(ERROR) :] for line in lines if line.startswith(ERROR)) or text
            if said:
                return said[-MESSAGE_CHARS:]
            return f"exit code {ended.get('exitCode')}"
    return ""
