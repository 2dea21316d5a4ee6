"""The CRD, the chart and the operator against a real API server and controller manager: what a
cluster with RBAC, Pod Security and OwnerReferencesPermissionEnforcement accepts and refuses, and
what its Job controller and garbage collector do to a run's children."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import CHART, OPERATOR_USER, Operator, helm
from controlplane import ControlPlane
from runs import ensure_crd, established, wait_for

from scalerl.kube import Kube, KubeError

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "examples" / "tiny-cluster.yaml").read_text())
CHILD_KINDS = (
    "configmaps,services,serviceaccounts,secrets,jobs,pods,roles,rolebindings,networkpolicies"
)


@pytest.fixture(scope="module")
def crd(plane: ControlPlane) -> dict[str, Any]:
    """The CRD as `kubectl apply -f crds/` installs it, once Established."""
    return ensure_crd(plane)


def run_yaml(namespace: str, **spec: Any) -> str:
    run = json.loads(json.dumps(TINY))
    run["metadata"]["namespace"] = namespace
    run["spec"].update(spec)
    return yaml.safe_dump(run)


def test_the_crd_is_established_and_its_rules_compile(crd: dict[str, Any]) -> None:
    conditions = {c["type"]: c for c in crd["status"]["conditions"]}
    assert conditions["NamesAccepted"]["status"] == "True"
    assert "NonStructuralSchema" not in conditions


def test_the_server_refuses_what_our_rules_refuse(
    plane: ControlPlane, crd: dict[str, Any], ns: str
) -> None:
    two = {"placement": "colocated", "generators": {"replicas": 2, "gpus": 0}}
    said = plane.kubectl("apply", "-f", "-", input=run_yaml(ns, **two), check=False)
    assert "placement colocated runs one process" in said, said
    many = {"trainers": {"replicas": 100_000, "gpus": 0}}
    said = plane.kubectl("apply", "-f", "-", input=run_yaml(ns, **many), check=False)
    assert "spec.trainers.replicas: Invalid value" in said, said
    plane.kubectl("apply", "-f", "-", input=run_yaml(ns))
    moved = {"placement": "colocated"}
    said = plane.kubectl("apply", "-f", "-", input=run_yaml(ns, **moved), check=False)
    assert "placement is immutable" in said, said


MONITORING_KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors"}
MONITORING_KINDS["PrometheusRule"] = "prometheusrules"


def monitoring_crds() -> str:
    """The Prometheus Operator's three kinds, with a schema that keeps whatever is sent."""
    docs = []
    for kind, plural in MONITORING_KINDS.items():
        docs.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.monitoring.coreos.com"},
                "spec": {
                    "group": "monitoring.coreos.com",
                    "names": {"kind": kind, "plural": plural},
                    "scope": "Namespaced",
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            }
        )
    return yaml.safe_dump_all(docs)


def monitors(plane: ControlPlane, namespace: str) -> list[str]:
    kinds = ",".join(MONITORING_KINDS.values())
    out = plane.kubectl("get", kinds, "-n", namespace, "-o", "name", check=False)
    return sorted(line for line in out.splitlines() if "/" in line and "error" not in line)


def test_helm_install_works_without_and_with_the_prometheus_operator(
    plane: ControlPlane, crd: dict[str, Any]
) -> None:
    release, namespace = "probe", "probe-system"
    done = helm(plane, "install", release, str(CHART), "-n", namespace, "--create-namespace")
    assert done.returncode == 0, done.stderr
    assert monitors(plane, namespace) == []
    plane.kubectl("apply", "-f", "-", input=monitoring_crds())
    for plural in MONITORING_KINDS.values():
        established(plane, f"{plural}.monitoring.coreos.com")
    done = helm(plane, "upgrade", release, str(CHART), "-n", namespace)
    assert done.returncode == 0, done.stderr
    assert len(monitors(plane, namespace)) == 3, monitors(plane, namespace)
    done = helm(plane, "uninstall", release, "-n", namespace)
    assert done.returncode == 0, done.stderr


# --- the operator, as the chart's ServiceAccount ------------------------------------------------


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path, tmp_path_factory: Any) -> Iterator[Operator]:
    """`scalerl operator` run here with the token of the chart's ServiceAccount: every request is
    authorized by the chart's ClusterRole."""
    running = Operator(operator_kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    running.start()
    try:
        yield running
    finally:
        running.stop()
    refused = running.refused()
    assert not refused, "the chart's ClusterRole refused the operator:\n" + "\n".join(refused)


def status(plane: ControlPlane, ns: str) -> dict[str, Any]:
    got = json.loads(plane.kubectl("get", "srl", "tiny", "-n", ns, "-o", "json"))
    return dict(got.get("status") or {})


def names_of(plane: ControlPlane, ns: str, kinds: str, selector: str) -> list[str]:
    out = plane.kubectl("get", kinds, "-n", ns, "-l", selector, "-o", "name")
    return sorted(out.split())


def test_a_run_gets_owned_children_and_a_deleted_pod_restarts_the_gang(
    plane: ControlPlane, operator: Operator, ns: str
) -> None:
    applied = time.monotonic()
    plane.kubectl("apply", "-f", "-", input=run_yaml(ns))
    uid = json.loads(plane.kubectl("get", "srl", "tiny", "-n", ns, "-o", "json"))["metadata"]["uid"]
    selector = "scalerl.dev/run=tiny,scalerl.dev/role=trainer"
    jobs = lambda: len(names_of(plane, ns, "jobs", "scalerl.dev/run=tiny")) == 2  # noqa: E731
    wait_for(jobs, "the trainer's and the generator's Jobs")
    print(f"kubectl apply -> both Jobs: {time.monotonic() - applied:.2f} s")
    # Pods made by the real Job controller, in a namespace that enforces `restricted`.
    trainer = wait_for(lambda: names_of(plane, ns, "pods", selector), "the trainer's pod")
    config = json.loads(plane.kubectl("get", "configmap", "tiny-config", "-n", ns, "-o", "json"))
    (owner,) = config["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["blockOwnerDeletion"]) == (uid, True)
    assert status(plane, ns).get("restarts", 0) == 0

    plane.kubectl("delete", "-n", ns, trainer[0], "--wait=false")
    restarted = wait_for(lambda: status(plane, ns).get("restarts") == 1, "a gang restart")
    assert restarted
    # The operator records the restart, then creates the new gang's Jobs: both come, in order.
    attempt_1 = "scalerl.dev/run=tiny,scalerl.dev/attempt=1"
    wait_for(
        lambda: len(names_of(plane, ns, "jobs", attempt_1)) == 2,
        "the trainer's and the generator's Jobs of attempt 1",
    )
    events = json.loads(plane.kubectl("get", "events", "-n", ns, "-o", "json"))["items"]
    said = [e["message"] for e in events if e["reason"] == "GangRestart"]
    assert said and "failed" in said[0], said

    plane.kubectl("delete", "srl", "tiny", "-n", ns, "--timeout=60s")
    left = lambda: names_of(plane, ns, CHILD_KINDS, "scalerl.dev/run=tiny") == []  # noqa: E731
    wait_for(left, "the garbage collector removing every child")
    # The operator's requests in the run's namespace over its whole life, as the server counted
    # them (its audit log): none refused.
    mine = [
        e
        for e in plane.audit()
        if e["user"]["username"] == OPERATOR_USER and e.get("objectRef", {}).get("namespace") == ns
    ]
    assert mine and not [e for e in mine if e["responseStatus"]["code"] == 403]
    counts = Counter(f"{e['verb']} {e['objectRef']['resource']}" for e in mine)
    print(f"operator requests for one run's life: {len(mine)}: {dict(sorted(counts.items()))}")


def test_an_invalid_object_is_no_conflict_but_a_lost_precondition_is(
    plane: ControlPlane, crd: dict[str, Any], ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both are a 422 from a real server; retrying the first (as a conflict) would send the same
    invalid object for ever."""
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    kube = Kube.connect()
    plane.kubectl("apply", "-f", "-", input=run_yaml(ns))
    api = "scalerl.dev/v1alpha1"
    with pytest.raises(KubeError) as invalid:
        kube.patch(api, "ScaleRLRun", ns, "tiny", {"spec": {"trainers": {"replicas": 100_000}}})
    assert invalid.value.status == 422 and not invalid.value.conflict
    assert "spec.trainers.replicas" in str(invalid.value)
    lost = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/spec/suspend", "value": True},
    ]
    with pytest.raises(KubeError) as precondition:
        kube.patch(api, "ScaleRLRun", ns, "tiny", lost, json_patch=True)
    assert precondition.value.status == 422 and precondition.value.conflict


def uids(plane: ControlPlane, ns: str) -> dict[str, str]:
    """name -> uid of every child of the run `tiny`."""
    out = plane.kubectl("get", CHILD_KINDS, "-n", ns, "-l", "scalerl.dev/run=tiny", "-o", "json")
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["uid"]
        for o in json.loads(out)["items"]
    }


def test_an_operator_restart_mid_run_creates_no_duplicate_child(
    plane: ControlPlane, operator: Operator, ns: str
) -> None:
    plane.kubectl("apply", "-f", "-", input=run_yaml(ns))
    jobs = lambda: len(names_of(plane, ns, "jobs", "scalerl.dev/run=tiny")) == 2  # noqa: E731
    wait_for(jobs, "the trainer's and the generator's Jobs")
    time.sleep(2)  # the Job controller makes the pods
    before = uids(plane, ns)
    operator.stop(signal.SIGKILL)  # no clean shutdown: whatever it was doing is cut off
    logged = len(operator.log.read_text())
    operator.start()
    # The new process resumes every run (kopf's resume handler reconciles each) and finds this
    # one whole.
    runs = len(plane.kubectl("get", "srl", "-A", "-o", "name").split())

    def resumed() -> bool:
        return operator.log.read_text()[logged:].count("Handler 'resume' succeeded") >= runs

    wait_for(resumed, "the restarted operator resuming every run")
    assert uids(plane, ns) == before
    assert status(plane, ns).get("restarts", 0) == 0
