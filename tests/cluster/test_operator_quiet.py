"""What the operator costs the API server, and what its trainer Service answers, on a real control
plane: the operator's handlers in kopf (`in_thread`) as the chart's ServiceAccount, every request
it makes counted from the server's audit log.

- its list and watch requests for pods and Jobs carry a label selector, so the server sends it the
  runs' children only, not every pod and Job in the namespaces it watches;
- a finished run costs the periodic check no request;
- after a gang restart the trainer Service selects the new gang's trainer 0 only, even while the
  old one is still terminating.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import yaml
from chart import OPERATOR_USER, in_thread
from controlplane import ControlPlane
from runs import ensure_crd, set_phase, wait_for

from scalerl.operator import gang, names

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "examples" / "tiny-cluster.yaml").read_text())
RUN = TINY["metadata"]["name"]
CHECK_S = 1.0  # the periodic check's interval in these tests (30 s in the chart)
QUIET_S = 5.0
UNRELATED = 40  # pods and Jobs of somebody else
HOLD = "test.scalerl.dev/hold"  # keeps a deleted pod terminating, as a kubelet's grace period does
CHILD_KINDS = "configmaps,services,serviceaccounts,secrets,jobs,roles,rolebindings,networkpolicies"


@pytest.fixture(scope="module")
def crd(plane: ControlPlane) -> None:
    ensure_crd(plane)


def create_run(plane: ControlPlane, ns: str) -> None:
    """The tiny example run (its claim does not exist: no pod ever starts by itself)."""
    body = {**TINY, "metadata": {"name": RUN, "namespace": ns}}
    code, reply = plane.api("POST", f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns", body)
    assert code == 201, reply


def delete_run(plane: ControlPlane, ns: str) -> None:
    """As a user deletes it; returns once the operator removed its finalizer."""
    plane.kubectl("delete", "srl", RUN, "-n", ns, "--timeout=60s")


def phase(plane: ControlPlane, ns: str) -> str | None:
    code, run = plane.api("GET", f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns/{RUN}")
    assert code == 200, run
    return (run.get("status") or {}).get("phase")


def listed(plane: ControlPlane, path: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    query = urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())})
    code, reply = plane.api("GET", f"{path}?{query}")
    assert code == 200, reply
    return list(reply["items"])


def pods(plane: ControlPlane, ns: str, **labels: str) -> list[dict[str, Any]]:
    return listed(plane, f"/api/v1/namespaces/{ns}/pods", labels)


def trainer_zero(attempt: int) -> dict[str, str]:
    return {
        names.LABEL_RUN: RUN,
        names.LABEL_ROLE: names.ROLE_TRAINER,
        names.LABEL_ATTEMPT: str(attempt),
        names.LABEL_JOB_INDEX: "0",
    }


def set_hold(plane: ControlPlane, pod: dict[str, Any], on: bool) -> None:
    """Add or remove our finalizer (a strategic merge keeps the Job controller's)."""
    meta = pod["metadata"]
    change = {"finalizers": [HOLD]} if on else {"$deleteFromPrimitiveList/finalizers": [HOLD]}
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    body = {"metadata": change}
    code, reply = plane.api(
        "PATCH", path, body, content_type="application/strategic-merge-patch+json"
    )
    assert code in (200, 404), reply


def operator_requests(
    plane: ControlPlane, ns: str, since: datetime | None = None
) -> list[dict[str, Any]]:
    """The operator's requests in namespace `ns` (received after `since`), per the audit log."""
    return [
        e
        for e in plane.audit()
        if e["user"]["username"] == OPERATOR_USER
        and e.get("objectRef", {}).get("namespace") == ns
        and (since is None or datetime.fromisoformat(e["requestReceivedTimestamp"]) >= since)
    ]


def summary(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e['verb']} {e['objectRef'].get('resource')} {e['requestURI']}" for e in events]


# --- 1. server-side selectors --------------------------------------------------------------------


def unrelated_objects(plane: ControlPlane, ns: str) -> None:
    """Pods and (suspended) Jobs without any scalerl label, as another team's would be."""
    spec = {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    job = {"suspend": True, "template": {"spec": {**spec, "restartPolicy": "Never"}}}
    for i in range(UNRELATED):
        meta = {"name": f"other-{i}", "labels": {"app": "other"}}
        for path, body in (
            (f"/api/v1/namespaces/{ns}/pods", {"metadata": meta, "spec": spec}),
            (f"/apis/batch/v1/namespaces/{ns}/jobs", {"metadata": meta, "spec": job}),
        ):
            code, reply = plane.api("POST", path, body)
            assert code == 201, reply


def children_reads(plane: ControlPlane, ns: str) -> dict[str, list[dict[str, Any]]]:
    """The operator's list and watch requests for pods and Jobs in `ns`, by resource."""
    out: dict[str, list[dict[str, Any]]] = {"pods": [], "jobs": []}
    for event in operator_requests(plane, ns):
        resource = event["objectRef"].get("resource")
        if resource in out and event["verb"] in ("list", "watch"):
            out[resource].append(event)
    return out


def selector_of(event: dict[str, Any]) -> str | None:
    values = parse_qs(urlsplit(event["requestURI"]).query).get("labelSelector")
    return values[0] if values else None


def sent(plane: ControlPlane, event: dict[str, Any]) -> tuple[int, int]:
    """What the server answers that list request (asked again, as the admin): items, bytes."""
    code, reply = plane.api("GET", event["requestURI"])
    assert code == 200, reply
    return len(reply["items"]), len(json.dumps(reply))


def test_the_server_sends_the_operator_only_the_runs_pods_and_jobs(
    plane: ControlPlane, operator_kubeconfig: Path, crd: None, ns: str
) -> None:
    other = plane.namespace(f"o-{uuid.uuid4().hex[:8]}", enforce="privileged")
    unrelated_objects(plane, other)

    def watching() -> dict[str, list[dict[str, Any]]] | None:
        reads = children_reads(plane, other)
        verbs = {(r, e["verb"]) for r, events in reads.items() for e in events}
        wanted = {(r, v) for r in reads for v in ("list", "watch")}
        return reads if verbs >= wanted else None

    with in_thread(plane, operator_kubeconfig, [ns, other]):
        reads = wait_for(watching, "the operator listing and watching pods and Jobs")
    for resource, events in reads.items():
        for event in events:
            assert selector_of(event) == names.LABEL_RUN, event["requestURI"]
        for event in (e for e in events if e["verb"] == "list"):
            items, size = sent(plane, event)
            print(f"{resource}: {event['requestURI']} -> {items} items, {size} bytes")
            assert items == 0, f"the server sent {items} unrelated {resource}"


# --- 2. a finished run ---------------------------------------------------------------------------


def test_a_finished_run_costs_the_periodic_check_no_request(
    plane: ControlPlane, operator_kubeconfig: Path, crd: None, ns: str
) -> None:
    with in_thread(plane, operator_kubeconfig, [ns], check_interval_s=CHECK_S):
        create_run(plane, ns)
        trainer = wait_for(lambda: pods(plane, ns, **trainer_zero(0)), "trainer 0's pod")[0]
        set_phase(
            plane, ns, trainer, "Succeeded", exit_code=0
        )  # trainer 0 exits 0: the budget is reached
        wait_for(lambda: phase(plane, ns) == "Succeeded", "the run Succeeded")
        ended = datetime.now(UTC)
        # The check looks at the finished run once (whatever its end left behind), then never.
        time.sleep(3 * CHECK_S)
        quiet_from = datetime.now(UTC)
        time.sleep(QUIET_S)
        after = operator_requests(plane, ns, ended)
        quiet = operator_requests(plane, ns, quiet_from)
        print(f"after the end: {len(after)} requests, then {len(quiet)} in {QUIET_S:.0f} s")
        assert quiet == [], summary(quiet)
        # Deleting the run still removes every child.
        delete_run(plane, ns)
    out = plane.kubectl(
        "get", CHILD_KINDS, "-n", ns, "-l", f"{names.LABEL_RUN}={RUN}", "-o", "name"
    )
    assert out.split() == []


# --- 3. the trainer Service across a gang restart -------------------------------------------------


def test_after_a_gang_restart_the_service_selects_only_the_new_trainer_zero(
    plane: ControlPlane,
    operator_kubeconfig: Path,
    crd: None,
    ns: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gang, "GENERATOR_RETRIES", 0)  # a generator's failure fails its Job
    with in_thread(plane, operator_kubeconfig, [ns]):
        create_run(plane, ns)
        old = wait_for(lambda: pods(plane, ns, **trainer_zero(0)), "trainer 0 of attempt 0")[0]
        set_hold(plane, old, on=True)
        try:
            generator_labels = {names.LABEL_RUN: RUN, names.LABEL_ROLE: names.ROLE_GENERATOR}
            generator = wait_for(lambda: pods(plane, ns, **generator_labels), "a generator")[0]
            set_phase(
                plane, ns, generator, "Failed", exit_code=1
            )  # the Job controller fails its Job: the gang restarts
            new = wait_for(lambda: pods(plane, ns, **trainer_zero(1)), "trainer 0 of attempt 1")
            code, service = plane.api(
                "GET", f"/api/v1/namespaces/{ns}/services/{names.service(RUN)}"
            )
            assert code == 200, service
            selected = pods(plane, ns, **service["spec"]["selector"])
            # The old trainer 0 is still there, terminating: a ready endpoint of any Service that
            # selects it (publishNotReadyAddresses).
            (dying,) = pods(plane, ns, **trainer_zero(0))
            assert dying["metadata"].get("deletionTimestamp")
            assert [p["metadata"]["name"] for p in selected] == [new[0]["metadata"]["name"]]
            # Every pod of the new gang still connects to that Service's name.
            for pod in pods(plane, ns, **{names.LABEL_RUN: RUN, names.LABEL_ATTEMPT: "1"}):
                env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
                assert env["SCALERL_TRAINER_HOST"] == f"{names.service(RUN)}.{ns}.svc"
        finally:
            set_hold(plane, old, on=False)
        delete_run(plane, ns)
