"""Measured figures of the operator against the emulator (printed; bounds asserted loosely).

Run with `-s` to see them: create -> every child present, and the API writes of one run's
lifecycle (create, 10 evaluations, a fit, delete) by who made them.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from harness import (
    NS,
    JobController,
    create,
    operator,
    owned,
    pods,
    run_manifest,
    set_phase,
)
from history_rows import history_row, progress_at, scored

from scalerl.kube import Kube
from scalerl.operator import crd
from scalerl.operator.prediction import fit_run
from scalerl.status import FileStatus
from scalerl.status.kubernetes import KubernetesStatus, RunStatus

WAIT = 30.0
EVALUATIONS = 10


class CountingKube(Kube):
    """A client that counts its writes."""

    writes = 0

    def request(self, method: str, path: str, body: Any = None, content_type: Any = None) -> Any:
        if method != "GET":
            self.writes += 1
        return super().request(method, path, body, content_type)


def actor(call: Any) -> str:
    """Who made a write: the user, the stand-ins for kubelet and Job controller, or the rest
    (the operator, kopf, trainer 0's sink, the fit)."""
    if (
        call.resource == "scalerlruns"
        and call.verb in ("create", "delete")
        and not call.subresource
    ):
        return "user"
    if call.resource == "pods" and call.subresource == "status":
        return "kubelet"
    if (call.resource, call.subresource) in (("pods", None), ("jobs", "status")):
        return "job-controller"
    return "cluster"


@pytest.fixture
def cluster(k8s: Any) -> Any:
    k8s.install_crd(crd.build_crd())
    return k8s


def test_api_writes_of_a_run_lifecycle(cluster: Any, tmp_path: Path) -> None:
    kube = CountingKube.connect(cluster.url)
    sink_kube, fit_kube = CountingKube.connect(cluster.url), CountingKube.connect(cluster.url)
    phases: dict[str, Counter[str]] = {}
    mark = 0

    def phase(name: str) -> None:
        nonlocal mark
        calls = cluster.requests
        phases[name] = Counter(actor(c) for c in calls[mark:] if c.is_write)
        mark = len(calls)

    with operator(cluster, kube=kube), JobController(cluster):
        started = time.monotonic()
        create(cluster, run_manifest(fit={"everyEvaluations": EVALUATIONS}))
        cluster.wait_for(lambda: len(pods(cluster)) == 3, WAIT, "the gang's pods")
        gang_s = time.monotonic() - started
        trainer = next(p for p in pods(cluster, role="trainer"))
        set_phase(cluster, trainer, "Running")
        cluster.wait_for(
            lambda: cluster.get("scalerlruns", "r1")["status"]["phase"] == "Running", WAIT
        )
        phase("create")
        sink = KubernetesStatus(RunStatus(sink_kube, NS, "r1"), FileStatus(tmp_path))
        for i in range(1, EVALUATIONS + 1):
            sink.progress(progress_at(i, 0.1 * i))
            sink.evaluation(history_row(i, 0.1 * i, 0.2 + 0.03 * i), scored(0.2 + 0.03 * i), [])
        cluster.wait_for(lambda: pods(cluster, role="fit"), WAIT, "the fit Job's pod")
        phase("10 evaluations")
        fit_run(RunStatus(fit_kube, NS, "r1"), bootstrap=20)
        set_phase(cluster, pods(cluster, role="fit")[0], "Succeeded", exit_code=0)
        cluster.wait_for(lambda: "Complete" in str(cluster.get("jobs", "r1-fit-1")["status"]))
        phase("a fit")
        cluster.kubectl("delete", "srl", "r1", "--timeout=60s", timeout=90)
        cluster.wait_for(lambda: owned(cluster) == {}, WAIT, "no children")
        phase("delete")
    own = {"10 evaluations": sink_kube.writes, "a fit": fit_kube.writes}
    print(f"\ncreate -> the gang's 3 pods (through the fake Job controller): {gang_s:.2f} s")
    print("API writes per phase: cluster = operator + kopf + trainer sink + fit Job")
    for name, counts in phases.items():
        trainer_or_fit = own.get(name, 0)
        operator_writes = counts["cluster"] - trainer_or_fit
        print(
            f"  {name:15} operator+kopf {operator_writes:3}  trainer/fit {trainer_or_fit:3}  "
            f"stand-ins {counts['kubelet'] + counts['job-controller']:3}  user {counts['user']}"
        )
    assert sink_kube.writes == 2 * EVALUATIONS  # one patch per progress, one per evaluation
    assert phases["create"]["cluster"] <= 20
