"""A run in a Kueue queue, against real Kueue and JobSet controllers on the real control plane:
its gang is one workload that Kueue admits all at once or not at all.

A team's ClusterQueue has two GPUs; the run's gang needs three (a trainer and two generators,
one GPU each). The run waits Queued with Kueue's reason and no pod anywhere, the startup clock
stopped; when the admin grants a third GPU, every pod of the gang is created at once. A gang
restart goes through the queue again; a gang Kueue evicts is Queued until readmitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import in_thread
from controlplane import ControlPlane
from queues import Queues
from runs import (
    condition,
    delete_run,
    ensure_crd,
    events,
    gang_up,
    of_role,
    owned,
    patch_run,
    phase_is,
    pods,
    requests,
    set_phase,
    set_running,
    status,
    wait_for,
)
from small_run import run_manifest
from test_rbac import ON_QUEUE, used

from scalerl.operator import manifests, names

# The gang of small_run: three pods, each 1 GPU, 4 CPUs and 32 GiB (the per-GPU defaults).
GANG_QUOTA = {"cpu": "12", "memory": "96Gi", "nvidia.com/gpu": "3"}


@pytest.fixture(scope="module")
def queues(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queues]:
    with Queues.start(plane, tmp_path_factory.mktemp("queues")) as started:
        print(f"Kueue and JobSet installed and serving in {started.started_s:.1f} s")
        yield started


def jobset(plane: ControlPlane, ns: str) -> dict[str, Any] | None:
    path = f"/apis/{manifests.JOBSET_API}/namespaces/{ns}/jobsets/r1"
    code, found = plane.api("GET", path)
    return dict(found) if code == 200 else None


def replacement_of(plane: ControlPlane, ns: str, failed: dict[str, Any]) -> dict[str, Any] | None:
    """The pod its Job made in place of `failed` (same role and index, not failed)."""
    labels = failed["metadata"]["labels"]
    for pod in pods(plane, ns, role=labels[names.LABEL_ROLE]):
        same = pod["metadata"]["labels"].get(names.LABEL_JOB_INDEX) == labels[names.LABEL_JOB_INDEX]
        if same and pod["metadata"]["name"] != failed["metadata"]["name"]:
            if (pod.get("status") or {}).get("phase") != "Failed":
                return pod
    return None


def pods_ready(plane: ControlPlane, ns: str) -> dict[str, Any]:
    return condition(plane, ns, "PodsReady") or {}


def test_a_queued_gang_waits_for_quota_then_starts_whole(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path, queues: Queues
) -> None:
    ensure_crd(plane)
    queues.cluster_queue(f"team-{ns}", {**GANG_QUOTA, "nvidia.com/gpu": "2"})
    queues.local_queue(ns, "gpus", f"team-{ns}")
    since = time.time()
    # The periodic check on, every second, with a startup timeout of 2 s: time in the queue
    # must not count as startup.
    spec = {"scheduling": {"queueName": "gpus"}, "failurePolicy": {"startupTimeoutSeconds": 2}}
    with in_thread(plane, operator_kubeconfig, namespaces=[], check_interval_s=1.0):
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(run_manifest(ns, **spec)))

        wait_for(
            lambda: "insufficient quota" in pods_ready(plane, ns).get("message", ""),
            "Kueue's reason",
        )
        held = pods_ready(plane, ns)
        assert phase_is(plane, ns, "Queued") and held["reason"] == "Queued"
        assert "nvidia.com/gpu" in held["message"], held
        gang = jobset(plane, ns)
        assert gang is not None and gang["spec"]["suspend"] is True
        assert gang["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"
        (workload,) = queues.workloads(ns)
        assert {p["name"]: p["count"] for p in workload["spec"]["podSets"]} == {
            "trainer": 1,
            "generator": 2,
        }
        time.sleep(3)  # past the startup timeout, with three periodic checks
        assert phase_is(plane, ns, "Queued") and pods(plane, ns) == []
        assert "startingSince" not in status(plane, ns)
        described = plane.kubectl("describe", "srl", "r1", "-n", ns)
        assert "insufficient quota" in described and "Queued" in described
        wide = plane.kubectl("get", "srl", "r1", "-n", ns, "-o", "wide")
        assert "Queued" in wide and "insufficient quota" in wide

        # The admin grants the third GPU: Kueue admits the one workload, both roles' pods.
        patch_run(plane, ns, {"failurePolicy": {"startupTimeoutSeconds": 600}})
        queues.cluster_queue(f"team-{ns}", GANG_QUOTA)
        gang_pods = gang_up(plane, ns, 0)
        (workload,) = queues.workloads(ns)
        admitted = {
            a["name"]: a["count"] for a in workload["status"]["admission"]["podSetAssignments"]
        }
        assert admitted == {"trainer": 1, "generator": 2}
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting on admission")
        (admission,) = events(plane, ns, "Admitted")
        assert admission["message"] == "Kueue admitted gang attempt 0 (queue gpus)"
        set_running(plane, ns, gang_pods)
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running")

        # A generator fails: its Job, in the admitted JobSet, makes a replacement of its index.
        # Kueue keeps the workload admitted as it was; nothing is queued again, no restart.
        failed = of_role(gang_pods, "generator")
        set_phase(plane, ns, failed, "Failed", exit_code=137)
        replacement = wait_for(lambda: replacement_of(plane, ns, failed), "its replacement")
        (still,) = queues.workloads(ns)
        assert still["metadata"]["uid"] == workload["metadata"]["uid"]
        assert still["status"]["admission"] == workload["status"]["admission"]
        assert phase_is(plane, ns, "Running") and status(plane, ns)["restarts"] == 0
        set_phase(plane, ns, replacement, "Running")
        wait_for(lambda: status(plane, ns)["generators"]["ready"] == 2, "2 generators again")
        assert status(plane, ns)["generators"]["replaced"] == 1

        # The trainer fails: the new gang is a new JobSet, queued and admitted again.
        set_phase(plane, ns, of_role(gang_pods, "trainer"), "Failed", exit_code=1)
        gang_pods = gang_up(plane, ns, 1)
        wait_for(
            lambda: (
                (jobset(plane, ns) or {})
                .get("metadata", {})
                .get("labels", {})
                .get(names.LABEL_ATTEMPT)
                == "1"
            ),
            "the JobSet of attempt 1",
        )
        wait_for(lambda: phase_is(plane, ns, "Starting"), "attempt 1 admitted")
        assert status(plane, ns)["restarts"] == 1
        set_running(plane, ns, gang_pods)
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running again")
        # Kueue's reasons are Events too (how many depends on when the checks ran); the rest,
        # posted by kopf in the background:
        lifecycle = ["Created", "Admitted", "Running", "GeneratorReplaced", "GangRestart"]
        lifecycle += ["Admitted", "Running"]
        wait_for(
            lambda: (
                [e["reason"] for e in events(plane, ns) if e["reason"] != "Queued"] == lifecycle
            ),
            f"the events {lifecycle}",
        )
        assert any("insufficient quota" in e["message"] for e in events(plane, ns, "Queued"))

        # The admin deactivates the workload: Kueue evicts the gang, JobSet suspends it and its
        # pods go. The run is Queued again with Kueue's words, until the workload is back.
        (workload,) = queues.workloads(ns)
        queues.activate(workload, False)
        wait_for(lambda: pods_ready(plane, ns).get("reason") == "Evicted", "the eviction said")
        assert phase_is(plane, ns, "Queued") and "startingSince" not in status(plane, ns)
        assert "deactivated" in pods_ready(plane, ns)["message"], pods_ready(plane, ns)
        wait_for(lambda: pods(plane, ns) == [], "the evicted gang's pods gone")
        queues.activate(workload, True)
        gang_pods = gang_up(plane, ns, 1)  # the same attempt: no restart used up
        wait_for(lambda: phase_is(plane, ns, "Starting"), "readmitted")
        set_running(plane, ns, gang_pods)
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running after the eviction")
        assert status(plane, ns)["restarts"] == 1

        delete_run(plane, ns)
        wait_for(lambda: owned(plane, ns) == {} and jobset(plane, ns) is None, "no children")
    assert ON_QUEUE <= used(requests(plane, since)), "the queue's permissions, as the chart grants"
