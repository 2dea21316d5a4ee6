"""A run in a test namespace of the real control plane, and the parts of a cluster the tests play
by hand: the user (create, patch, delete), trainer 0 and the fit Job (status patches), and the
kubelet, which this control plane has none of (pod phases, written to `pods/status` as the admin).

The real Job controller makes the pods (`<job>-<index>-<random>`) and, with `backoffLimit: 0`,
fails a Job whose pod failed and deletes its other pods; the garbage collector removes what the
operator leaves. Every helper takes the control plane and the namespace first:

    create_run(plane, ns, run_manifest(ns, fit={"everyEvaluations": 3}))
    gang = gang_up(plane, ns)                    # the Job controller's pods of gang attempt 0
    set_running(plane, ns, gang)                 # every pod Running: the run is Running
    wait_for(lambda: phase_is(plane, ns, "Running"), "Running")
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from controlplane import ControlPlane

from scalerl.operator import names

T = TypeVar("T")
CRD = Path(__file__).resolve().parents[2] / "crds" / "scalerlruns.scalerl.dev.yaml"
RUNS = "/apis/scalerl.dev/v1alpha1/namespaces"
CRD_NAME = "scalerlruns.scalerl.dev"
# Deadlines, not sleeps: generous, because a loaded 2-core machine slows every request.
WAIT_S = 60.0
POLL_S = 0.1
GANG_PODS = 3  # run_manifest's: 1 trainer + 2 generators
# The collections of a run's children (and their pods), by resource.
CHILDREN = {
    "configmaps": "/api/v1",
    "secrets": "/api/v1",
    "services": "/api/v1",
    "serviceaccounts": "/api/v1",
    "networkpolicies": "/apis/networking.k8s.io/v1",
    "roles": "/apis/rbac.authorization.k8s.io/v1",
    "rolebindings": "/apis/rbac.authorization.k8s.io/v1",
    "jobs": "/apis/batch/v1",
    "deployments": "/apis/apps/v1",
    "pods": "/api/v1",
}


def wait_for(what: Callable[[], T | None], message: str, timeout_s: float = WAIT_S) -> T:
    """`what()` once it is truthy; fails after `timeout_s` saying what did not happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {message}")
        time.sleep(POLL_S)


def ensure_crd(plane: ControlPlane) -> dict[str, Any]:
    """The CRD as `kubectl apply -f crds/` installs it, once the server serves it."""
    plane.kubectl("apply", "--server-side", "-f", str(CRD))
    return established(plane, CRD_NAME)


def established(plane: ControlPlane, name: str) -> dict[str, Any]:
    """CRD `name` once Established. Polled rather than `kubectl wait --for=condition=Established`,
    which fails outright when it reads a CRD the apiextensions controller has not given
    conditions yet (one just created)."""

    def serving() -> dict[str, Any] | None:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        code, got = plane.api("GET", path)
        assert code == 200, got
        conditions = (got.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        return dict(got) if ready else None

    return wait_for(serving, f"the CRD {name} Established")


# --- the run -------------------------------------------------------------------------------------


def create_run(plane: ControlPlane, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    """As a user: the run created (the server's copy, uid included)."""
    code, created = plane.api("POST", f"{RUNS}/{ns}/scalerlruns", body)
    assert code == 201, created
    return dict(created)


def get_run(plane: ControlPlane, ns: str, run: str = "r1") -> dict[str, Any] | None:
    code, found = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/{run}")
    if code == 404:
        return None
    assert code == 200, found
    return dict(found)


def status(plane: ControlPlane, ns: str, run: str = "r1") -> dict[str, Any]:
    return dict((get_run(plane, ns, run) or {}).get("status") or {})


def phase_is(plane: ControlPlane, ns: str, phase: str, run: str = "r1") -> bool:
    return status(plane, ns, run).get("phase") == phase


def condition(plane: ControlPlane, ns: str, type_: str, run: str = "r1") -> dict[str, Any] | None:
    conditions = status(plane, ns, run).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), None)


def patch_run(plane: ControlPlane, ns: str, spec: dict[str, Any], run: str = "r1") -> None:
    """As a user: a merge patch of the run's spec."""
    code, body = plane.api_patch(f"{RUNS}/{ns}/scalerlruns/{run}", {"spec": spec})
    assert code == 200, body


def patch_run_status(plane: ControlPlane, ns: str, fields: dict[str, Any], run: str = "r1") -> None:
    """Play trainer 0 or a fit Job: a merge patch of the run's status."""
    code, body = plane.api_patch(f"{RUNS}/{ns}/scalerlruns/{run}/status", {"status": fields})
    assert code == 200, body


def delete_run(plane: ControlPlane, ns: str, run: str = "r1") -> None:
    """`kubectl delete srl`: returns once the operator has removed its finalizer. When it does
    not, the error shows what kopf left on the run (its finalizer, its handlers' progress)."""
    try:
        plane.kubectl("delete", "srl", run, "-n", ns, "--timeout=60s")
    except AssertionError as err:
        code, body = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/{run}")
        meta = body.get("metadata", {}) if code == 200 else {}
        left = {k: meta.get(k) for k in ("finalizers", "annotations", "deletionTimestamp")}
        raise AssertionError(f"{err}\nthe run as the deletion left it: {left}") from None


def events(plane: ControlPlane, ns: str, reason: str | None = None) -> list[dict[str, Any]]:
    """The Events kopf posted for runs, oldest first."""
    code, found = plane.api("GET", f"/api/v1/namespaces/{ns}/events")
    assert code == 200, found
    mine = [e for e in found["items"] if e["involvedObject"].get("kind") == "ScaleRLRun"]
    mine.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e for e in mine if reason is None or e["reason"] == reason]


def event_reasons(plane: ControlPlane, ns: str, *expected: str) -> None:
    """Wait until the runs' Events are `expected` (kopf posts them in the background)."""

    def reasons() -> list[str]:
        return [e["reason"] for e in events(plane, ns)]

    try:
        wait_for(lambda: reasons() == list(expected), f"the events {expected}")
    except AssertionError as err:
        raise AssertionError(f"{err}; posted: {reasons()}") from None


# --- its children --------------------------------------------------------------------------------


def listed(plane: ControlPlane, ns: str, resource: str, run: str = "r1") -> list[dict[str, Any]]:
    """The objects of `resource` labelled with the run."""
    path = f"{CHILDREN[resource]}/namespaces/{ns}/{resource}?labelSelector={names.LABEL_RUN}={run}"
    code, found = plane.api("GET", path)
    assert code == 200, found
    return list(found["items"])


def owned(plane: ControlPlane, ns: str, run: str = "r1") -> dict[str, list[str]]:
    """Names of the run's children by resource (labelled with the run), pods included."""
    out = {}
    for resource in CHILDREN:
        found = sorted(o["metadata"]["name"] for o in listed(plane, ns, resource, run))
        if found:
            out[resource] = found
    return out


def pods(
    plane: ControlPlane, ns: str, run: str = "r1", role: str | None = None
) -> list[dict[str, Any]]:
    """The run's pods not being deleted (a Job's pods keep the Job controller's finalizer a
    moment after their deletion), of one role or all."""
    return [
        p
        for p in listed(plane, ns, "pods", run)
        if not p["metadata"].get("deletionTimestamp")
        and (role is None or p["metadata"]["labels"][names.LABEL_ROLE] == role)
    ]


def attempt_of(pod: dict[str, Any]) -> str | None:
    return str(pod["metadata"]["labels"].get(names.LABEL_ATTEMPT))


def gang_up(plane: ControlPlane, ns: str, attempt: int = 0, size: int = GANG_PODS) -> list[Any]:
    """Wait for the gang of `attempt` to have all its `size` pods (and no other trainer or
    generator pod: a fit Job's, or the run's OpenEnv server's, may stay); return them."""

    def ready() -> list[dict[str, Any]] | None:
        found = [
            p
            for p in pods(plane, ns)
            if p["metadata"]["labels"][names.LABEL_ROLE] not in (names.ROLE_FIT, names.ROLE_ENV)
        ]
        gang = [p for p in found if attempt_of(p) == str(attempt)]
        return gang if len(gang) == size == len(found) else None

    return wait_for(ready, f"the {size} pods of gang attempt {attempt}")


def of_role(gang: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return next(p for p in gang if p["metadata"]["labels"][names.LABEL_ROLE] == role)


def set_phase(
    plane: ControlPlane, ns: str, pod: dict[str, Any], phase: str, exit_code: int | None = None
) -> None:
    """Play the kubelet: the pod's phase (and its container's exit code)."""
    fields: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        container = pod["spec"]["containers"][0]
        ended = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        fields["containerStatuses"] = [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": ended},
            }
        ]
    write_pod_status(plane, ns, pod, fields)


def write_pod_status(plane: ControlPlane, ns: str, pod: dict[str, Any], fields: Any) -> None:
    """`pods/status` as the kubelet (or the scheduler) writes it."""
    path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status"
    code, body = plane.api_patch(path, {"status": fields})
    assert code == 200, body


def set_running(plane: ControlPlane, ns: str, gang: list[dict[str, Any]]) -> None:
    """Play the kubelet for a whole gang: every pod Running (a run runs once all of them do)."""
    for pod in gang:
        set_phase(plane, ns, pod, "Running")


def bare_pod(ns: str, name: str, like: dict[str, Any]) -> dict[str, Any]:
    """A pod with the labels of the run's pod `like` (the scalerl.dev ones) and none of its
    owners: a leftover of a gang, as `restricted` Pod Security admits it (`like`'s security)."""
    labels = {k: v for k, v in like["metadata"]["labels"].items() if k.startswith("scalerl.dev/")}
    container = like["spec"]["containers"][0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "securityContext": like["spec"]["securityContext"],
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "securityContext": container["securityContext"],
                }
            ],
        },
    }


def create_pod(plane: ControlPlane, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    code, created = plane.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, created
    return dict(created)


# --- what the API server saw ---------------------------------------------------------------------


def requests(plane: ControlPlane, since: float) -> list[dict[str, Any]]:
    """The audit log's requests received since `since` (a `time.time()`), one event each: the
    last stage it reached (a watch still open has only ResponseStarted)."""
    last = {e["auditID"]: e for e in plane.audit() if received(e) >= since}
    return sorted(last.values(), key=received)


def received(event: dict[str, Any]) -> float:
    """When the server received the request, as a `time.time()`."""
    stamp = event["requestReceivedTimestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def in_namespace(event: dict[str, Any], ns: str) -> bool:
    return bool(event.get("objectRef", {}).get("namespace") == ns)
