"""Test harness for the operator: a run to apply, the operator started in an explicit registry,
and a stand-in for the Job controller the emulator lacks.

The fake Job controller makes what Kubernetes' would for an Indexed Job (pods named
"<job>-<index>-<suffix>" with the completion-index label, annotation and JOB_COMPLETION_INDEX) and
keeps the Job's status in line with its pods. Pods stay Pending until a test sets their phase, or
the test kubelet (kubelet.py) runs their command with their environment.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

import kopf

from scalerl.kube import Kube
from scalerl.metrics import RunMetrics
from scalerl.operator import names
from scalerl.operator.handlers import register
from scalerl.operator.manifests import Images

NS = "default"
RUNS = "scalerlruns"


def run_manifest(name: str = "r1", **spec: Any) -> dict[str, Any]:
    """A small valid run: one trainer, two generators, one GPU each."""
    body: dict[str, Any] = {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"path": "/models/base"},
            "data": {"train": "/data/train.jsonl"},
            "fit": {"everyEvaluations": 3, "minCompute": 0},
            "generators": {"replicas": 2, "gpus": 1},
            "trainers": {"replicas": 1, "gpus": 1},
            "checkpoint": {"claimName": "ckpt"},
        },
    }
    _merge(body["spec"], spec)
    return body


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@contextlib.contextmanager
def operator(
    k8s: Any,
    *,
    check_interval_s: float = 3600.0,
    kube: Kube | None = None,
    metrics: RunMetrics | None = None,
) -> Iterator[Any]:
    """The operator, as `kopf run -m scalerl.operator` registers it, in a registry of its own.

    The periodic check is off by default: the tests prove the event-driven paths.
    """
    registry = kopf.OperatorRegistry()
    register(registry, check_interval_s=check_interval_s)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=k8s.url, insecure=True)

    memo = kopf.Memo(kube=kube or Kube.connect(k8s.url, agent=names.MANAGED_BY), images=Images())
    if metrics is not None:
        memo.metrics = metrics  # as `scalerl operator --metrics-port` serves them
    with k8s.operator(registry, memo=memo) as handle:
        yield handle


# --- objects ------------------------------------------------------------------------------------


def create(k8s: Any, obj: dict[str, Any]) -> dict[str, Any]:
    api_version, kind = obj["apiVersion"], obj["kind"]
    reply = k8s.api("POST", _collection(api_version, kind), obj)
    assert reply.status == 201, reply.body
    return dict(reply.json())


def _collection(api_version: str, kind: str) -> str:
    from scalerl.kube import api_path

    return api_path(api_version, kind, NS)


def status(k8s: Any, run: str = "r1") -> dict[str, Any]:
    found = k8s.get(RUNS, run)
    return dict((found or {}).get("status") or {})


def phase_is(k8s: Any, phase: str, run: str = "r1") -> bool:
    return status(k8s, run).get("phase") == phase


def condition(k8s: Any, type_: str, run: str = "r1") -> dict[str, Any] | None:
    return next((c for c in status(k8s, run).get("conditions", []) if c["type"] == type_), None)


def owned(k8s: Any, run: str = "r1") -> dict[str, list[str]]:
    """Names of the run's children by resource (labelled with the run)."""
    out: dict[str, list[str]] = {}
    for resource in (
        "configmaps",
        "secrets",
        "networkpolicies",
        "services",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "jobs",
        "pods",
    ):
        found = [
            o["metadata"]["name"]
            for o in k8s.objects(resource, NS)
            if (o["metadata"].get("labels") or {}).get(names.LABEL_RUN) == run
        ]
        if found:
            out[resource] = sorted(found)
    return out


def pods(k8s: Any, run: str = "r1", role: str | None = None) -> list[dict[str, Any]]:
    found = [
        p
        for p in k8s.objects("pods", NS)
        if (p["metadata"].get("labels") or {}).get(names.LABEL_RUN) == run
        and not p["metadata"].get("deletionTimestamp")
    ]
    return [p for p in found if role is None or p["metadata"]["labels"][names.LABEL_ROLE] == role]


def set_phase(k8s: Any, pod: dict[str, Any], phase: str, exit_code: int | None = None) -> None:
    """Play the kubelet: the pod's phase (and its container's exit code)."""
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [
            {
                "name": pod["spec"]["containers"][0]["name"],
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                    }
                },
            }
        ]
    path = f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status"
    reply = k8s.api("PATCH", path, {"status": status}, content_type="application/merge-patch+json")
    assert reply.status == 200, reply.body


def patch_run_status(k8s: Any, fields: dict[str, Any], run: str = "r1") -> None:
    """Play trainer 0 or a fit Job: a merge patch of the run's status."""
    path = f"/apis/scalerl.dev/v1alpha1/namespaces/{NS}/scalerlruns/{run}/status"
    reply = k8s.api("PATCH", path, {"status": fields}, content_type="application/merge-patch+json")
    assert reply.status == 200, reply.body


def patch_run(k8s: Any, spec: dict[str, Any], run: str = "r1") -> None:
    path = f"/apis/scalerl.dev/v1alpha1/namespaces/{NS}/scalerlruns/{run}"
    reply = k8s.api("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json")
    assert reply.status == 200, reply.body


# --- the Job controller the emulator lacks -------------------------------------------------------


class JobController:
    """Pods for Jobs, and Job status from their pods (see the module docstring)."""

    def __init__(self, k8s: Any) -> None:
        self.k8s = k8s
        self.stop = threading.Event()
        self.changed = threading.Event()
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._loop, name="job-controller", daemon=True)

    def __enter__(self) -> JobController:
        # Woken by every write to the emulator's store, rather than polling it.
        self.k8s.call(self.k8s.emulator.store.listeners.append, self.changed.set)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.changed.set()
        self.thread.join(10)
        assert not self.errors, f"the fake Job controller failed: {self.errors!r}"

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.changed.clear()
            try:
                self.sync()
            except Exception as err:  # keep going; the test sees it at exit
                self.errors.append(err)
            self.changed.wait(1.0)

    def sync(self) -> None:
        live = [
            p for p in self.k8s.objects("pods", NS) if not p["metadata"].get("deletionTimestamp")
        ]
        jobs = self.k8s.objects("jobs", NS)
        uids = {j["metadata"]["uid"] for j in jobs}
        for pod in live:  # garbage collection: a pod made just as its Job went away
            if _owner_uid(pod) is not None and _owner_uid(pod) not in uids:
                self.k8s.api("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
        for job in jobs:
            if job["metadata"].get("deletionTimestamp"):
                continue
            uid = job["metadata"]["uid"]
            mine = [p for p in live if _owner_uid(p) == uid]
            have = {p["metadata"]["labels"].get(names.LABEL_JOB_INDEX) for p in mine}
            for index in range(job["spec"].get("completions", 1)):
                if str(index) not in have:
                    self.k8s.api("POST", f"/api/v1/namespaces/{NS}/pods", job_pod(job, index))
            self._job_status(job, mine)

    def _job_status(self, job: dict[str, Any], mine: list[dict[str, Any]]) -> None:
        phases = [(p.get("status") or {}).get("phase") for p in mine]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        done = None
        if failed > job["spec"].get("backoffLimit", 6):
            done = "Failed"
        elif succeeded >= job["spec"].get("completions", 1):
            done = "Complete"
        wanted: dict[str, Any] = {
            "succeeded": succeeded,
            "failed": failed,
            "active": len(phases) - succeeded - failed,
        }
        if done:
            wanted["conditions"] = [{"type": done, "status": "True"}]
        current = job.get("status") or {}
        if any(current.get(k) != v for k, v in wanted.items()):
            path = f"/apis/batch/v1/namespaces/{NS}/jobs/{job['metadata']['name']}/status"
            self.k8s.api(
                "PATCH", path, {"status": wanted}, content_type="application/merge-patch+json"
            )


def _owner_uid(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs[0]["uid"] if refs else None


def job_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """The pod an Indexed Job's controller makes for `index`."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = job["metadata"]
    labels = {
        **template["metadata"].get("labels", {}),
        names.LABEL_JOB_INDEX: str(index),
        "job-name": meta["name"],
        "batch.kubernetes.io/job-name": meta["name"],  # both, as Kubernetes 1.27+ labels them
    }
    spec = template["spec"]
    spec["hostname"] = f"{meta['name']}-{index}"
    index_field = f"metadata.annotations['{names.LABEL_JOB_INDEX}']"
    for container in spec["containers"]:  # as Kubernetes sets it: the downward API
        container.setdefault("env", []).append(
            {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_field}}}
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{index}-{meta['uid'][:5]}",
            "namespace": NS,
            "labels": labels,
            "annotations": {names.LABEL_JOB_INDEX: str(index)},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }
