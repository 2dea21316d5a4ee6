"""The initializer Job: a run's hf:// model and data downloaded once, before its gang exists.

A GPU must never wait on a download, so the gang (and a queued run's JobSet, which Kueue would
admit) is created only once the initializer has recorded every hf:// source of the spec in
status.sources. The Job runs `scalerl fetch-sources` (scalerl.fetch) as the run's ServiceAccount,
under the restricted profile like every pod of the run, with the claim mounted whole at /store:

- the Hugging Face cache is the claim's `hub/` folder (HF_HUB_CACHE=/store/hub), shared by every
  run on that claim: a commit already there is not downloaded again, and a download cut off
  resumes from its `.incomplete` files when the Job (or a later run) tries again;
- sources.json goes into the run's directory (runs/<run>), so a resumed or re-initialized run
  loads the commits it recorded, as a local run does;
- the token (spec.hub.tokenSecret) reaches this pod alone, as HF_TOKEN from the Secret; the
  mirror (spec.hub.endpoint) is its HF_ENDPOINT.

Why the operator's own image (the chart's fit image): it is small and runs on any CPU node; its
Dockerfile installs huggingface-hub for this Job alone (the operator's code never imports it:
lint-imports). The generator image has it too, but it is a CUDA image of many GB that a CPU node
would pull for a few HTTP requests.

The gang's pods then mount `hub/` read-only at the same path and run with HF_HUB_OFFLINE=1; the
spec they read (the run's ConfigMap) names the local files, not the ids (scalerl.operator.sources).
The Job is owned by the run, kept while it lives (its pods' logs show the download's progress),
and replaced when the spec names other sources.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from scalerl.kube import Kube
from scalerl.operator import names, objects, sources
from scalerl.operator.objects import CONTAINER_SECURITY, Images, Owner
from scalerl.operator.sources import CACHE_DIR, CONDITION, FAILED, HUB_SUBDIR, STORE_DIR
from scalerl.spec import ScaleRLRun

KEY_ANNOTATION = "scalerl.dev/sources"  # which sources (and Hub settings) a Job downloads
# One more try for a transient failure (a dropped connection); a missing repo fails twice fast.
BACKOFF_LIMIT = 1
DOWNLOADING = "Downloading"


def problems(run: ScaleRLRun) -> list[str]:
    """Why the run's hf:// sources cannot be downloaded on a cluster (none: they can)."""
    if sources.uses_hub(run) and run.spec.checkpoint.claim_name is None:
        return [
            "spec.checkpoint.claimName: a run with hf:// sources needs a claim on a cluster: "
            f"its initializer Job downloads them once into the claim's {HUB_SUBDIR}/, where "
            "every pod of the run reads them"
        ]
    return []


def key(run: ScaleRLRun) -> str:
    """What a Job downloads, in short: the run's hf:// values and how the Hub is reached."""
    hub = run.spec.hub.model_dump(by_alias=True, mode="json")
    wanted = [[w.field, w.uri, w.split, list(w.data_files)] for w in sources.wanted(run)]
    text = json.dumps([wanted, hub], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job(run: ScaleRLRun, owner: Owner, images: Images) -> dict[str, Any]:
    """The initializer Job of `run` (which has a claim: see `problems`)."""
    claim = run.spec.checkpoint.claim_name
    command = [
        "scalerl", "fetch-sources",
        "--spec", f"{objects.CONFIG_DIR}/{objects.SPEC_FILE}",
        "--out", f"{STORE_DIR}/runs/{run.name}",
        "--run", owner.name, "--namespace", owner.namespace,
    ]  # fmt: skip
    container = {
        "name": names.ROLE_INITIALIZER,
        "image": images.initializer,
        "command": command,
        "env": environ(run),
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        "volumeMounts": [
            {"name": "config", "mountPath": objects.CONFIG_DIR, "readOnly": True},
            {"name": "store", "mountPath": STORE_DIR},
        ],
        "securityContext": CONTAINER_SECURITY,
    }
    metadata = owner.metadata(names.initializer(owner.name), names.ROLE_INITIALIZER)
    metadata["annotations"] = {KEY_ANNOTATION: key(run)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": names.labels(owner.name, names.ROLE_INITIALIZER)},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names.account(owner.name),  # writes status.sources
                    "securityContext": images.for_run(run).pod_security(),
                    **images.pod_fields(),
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": names.config(owner.name)}},
                        {"name": "store", "persistentVolumeClaim": {"claimName": claim}},
                    ],
                },
            },
        },
    }


def environ(run: ScaleRLRun) -> list[dict[str, Any]]:
    """The initializer's environment: the cache on the claim, the mirror, the token (only here)."""
    hub = run.spec.hub
    env: list[dict[str, Any]] = [{"name": "HF_HUB_CACHE", "value": CACHE_DIR}]
    if hub.endpoint is not None:
        env.append({"name": "HF_ENDPOINT", "value": hub.endpoint})
    if hub.token_secret is not None:
        ref = {"name": hub.token_secret.name, "key": hub.token_secret.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


@dataclass(frozen=True)
class Progress:
    """Where the initializer stands: `reason` (Downloading or DownloadFailed) and the line a
    user reads; `created`: this call created the Job."""

    reason: str
    message: str
    created: bool = False


def ensure(
    kube: Kube, run: ScaleRLRun, owner: Owner, images: Images, status: dict[str, Any]
) -> Progress:
    """The run's initializer Job, created where missing (replaced where it downloads other
    sources), and what it says: its pod's SourcesReady condition, else the Job's own failure."""
    name = names.initializer(owner.name)
    current = kube.find("batch/v1", "Job", owner.namespace, name)
    if current is not None and _key_of(current) != key(run):
        kube.delete("batch/v1", "Job", owner.namespace, name)
        current = None
    uris = ", ".join(w.uri for w in sources.wanted(run))
    downloading = f"downloading {uris} into claim {run.spec.checkpoint.claim_name} (Job {name})"
    if current is None:
        created = kube.create(job(run, owner, images)) is not None
        return Progress(DOWNLOADING, downloading, created=created)
    said = _condition(status, CONDITION)
    failed = _job_failure(current)
    if said.get("reason") == FAILED and said.get("status") == "False":
        retry = "; delete Job {name} to try again" if failed else "; trying again"
        return Progress(FAILED, f"{said.get('message')}{retry.format(name=name)}")
    if failed is not None:
        return Progress(FAILED, f"Job {name} failed: {failed}; delete it to try again")
    if _job_complete(current):
        return Progress(FAILED, f"Job {name} completed without recording every source in "
                        "status.sources; delete it to try again")  # fmt: skip
    return Progress(DOWNLOADING, downloading)


def _key_of(job_obj: dict[str, Any]) -> str | None:
    return (job_obj["metadata"].get("annotations") or {}).get(KEY_ANNOTATION)


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def _job_failure(job_obj: dict[str, Any]) -> str | None:
    for condition in (job_obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return ": ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
    return None


def _job_complete(job_obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (job_obj.get("status") or {}).get("conditions") or []
    )
