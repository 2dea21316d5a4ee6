"""The chart grants the operator exactly what it uses: a run's whole life, every request checked.

Every operator test also fails if the operator made a request the ClusterRole would refuse (the
`k8s` fixture checks it); this one also finds permissions the operator never uses.
"""

from __future__ import annotations

from typing import Any

from harness import (
    NS,
    JobController,
    create,
    operator,
    owned,
    patch_run,
    patch_run_status,
    phase_is,
    pods,
    run_manifest,
    set_phase,
)
from rbaccheck import chart_rules, granted, needed

from scalerl.operator import crd

WAIT = 30.0


def role_pods(k8s: Any, role: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(k8s, role=role)
        if p["metadata"]["labels"].get("scalerl.dev/attempt") == str(attempt)
    ]


def stray_pod() -> dict[str, Any]:
    labels = {"scalerl.dev/run": "r1", "scalerl.dev/role": "generator"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "r1-generator-0-stray", "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "generator", "image": "scalerl/generator:0.1.0"}]},
    }


def a_runs_whole_life(k8s: Any) -> None:
    """Create, run, fail and restart, fit, suspend and resume, stop on the prediction, delete."""
    stop = {"predictedABelow": 0.5, "minPoints": 4}
    create(k8s, run_manifest(fit={"everyEvaluations": 2}, budget={"stopWhen": stop}))
    generator = k8s.wait_for(lambda: role_pods(k8s, "generator", 0), WAIT, "the gang")[0]
    trainer = k8s.wait_for(lambda: role_pods(k8s, "trainer", 0), WAIT, "the trainer")[0]
    set_phase(k8s, trainer, "Running")
    k8s.wait_for(lambda: phase_is(k8s, "Running"), WAIT, "Running")
    set_phase(k8s, generator, "Failed", exit_code=1)
    k8s.wait_for(lambda: role_pods(k8s, "trainer", 1), WAIT, "the restarted gang")
    points = [{"step": i, "computeHours": 1.0 + i, "passRate": 0.2} for i in range(2)]
    patch_run_status(k8s, {"evaluations": points, "evaluationCount": 2})
    fit = k8s.wait_for(lambda: pods(k8s, role="fit"), WAIT, "the fit Job's pod")[0]
    set_phase(k8s, fit, "Succeeded", exit_code=0)
    patch_run(k8s, {"suspend": True})
    k8s.wait_for(lambda: phase_is(k8s, "Suspended"), WAIT, "Suspended")
    patch_run(k8s, {"suspend": False})
    k8s.wait_for(lambda: role_pods(k8s, "trainer", 1), WAIT, "the resumed gang")
    hopeless = {"A": 0.3, "B": 1.5, "C_mid": 10.0, "R0": 0.1, "A_interval": [0.28, 0.33]}
    patch_run_status(k8s, {"prediction": {**hopeless, "points": 4}})
    k8s.wait_for(lambda: phase_is(k8s, "Failed"), WAIT, "stopped by its prediction")
    # A pod the Job controller has not collected yet: the operator deletes it itself.
    create(k8s, stray_pod())
    k8s.kubectl("delete", "srl", "r1", "--timeout=60s", timeout=90)
    k8s.wait_for(lambda: owned(k8s) == {}, WAIT, "no children")


# Checked by an admission plugin on requests that name other resources, never requested itself:
# OwnerReferencesPermissionEnforcement lets a child carry blockOwnerDeletion only for a client
# that may update its owner's finalizers.
ADMISSION_ONLY = {("scalerl.dev", "scalerlruns/finalizers", "update")}


def test_the_cluster_role_is_exactly_what_the_operator_uses(k8s: Any) -> None:
    k8s.install_crd(crd.build_crd())
    with operator(k8s), JobController(k8s):
        a_runs_whole_life(k8s)
    used = needed(k8s.requests)
    assert used - granted() == set(), "requests the chart's ClusterRole refuses"
    assert granted() - used == ADMISSION_ONLY, "permissions the operator never used"


def test_the_cluster_role_has_no_wildcards() -> None:
    for rule in chart_rules():
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "resourceNames" not in rule  # runs and their children are named by users
