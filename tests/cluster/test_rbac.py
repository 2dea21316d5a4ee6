"""The chart grants the operator exactly what it uses, judged by the real API server.

Every operator test already fails when the server refused one of the operator's requests (the
`ns` fixture reads the audit log); this one also finds permissions the operator never uses. The
operator runs as the chart's default values run it (every namespace) through a run's whole life,
and every request the server received from the chart's ServiceAccount is a permission used.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from chart import CHART, OPERATOR_ACCOUNT, OPERATOR_USER, account_kubeconfig, helm, in_thread
from controlplane import ControlPlane
from runs import (
    bare_pod,
    create_pod,
    create_run,
    delete_run,
    ensure_crd,
    events,
    gang_up,
    of_role,
    owned,
    patch_run,
    patch_run_status,
    phase_is,
    pods,
    requests,
    set_phase,
    set_running,
    status,
    wait_for,
)
from small_run import run_manifest

from scalerl.operator.manifests import Images

Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb), as RBAC checks it

# Checked by an admission plugin on requests that name other resources, never requested itself:
# OwnerReferencesPermissionEnforcement lets a child carry blockOwnerDeletion only for a client
# that may update its owner's finalizers.
ADMISSION_ONLY = {
    ("scalerl.dev", "scalerlruns/finalizers", "update"),
    ("scalerl.dev", "scalerlsweeps/finalizers", "update"),  # a sweep's runs point at it
}
# Used only when the cluster refuses to create a gang's pods (the Job controller's FailedCreate
# Events say why; test_operator.py meets a quota), which a run's whole life here does not.
ON_REFUSAL = {("", "events", "list")}
# Used only by sweeps (test_sweeps.py checks them against the audit log).
ON_SWEEP = {
    ("scalerl.dev", "scalerlsweeps", "list"),  # kopf's watch, where the sweeps' CRD is served
    ("scalerl.dev", "scalerlsweeps", "watch"),
    ("scalerl.dev", "scalerlsweeps", "get"),
    ("scalerl.dev", "scalerlsweeps", "patch"),
    ("scalerl.dev", "scalerlsweeps/status", "patch"),
    ("scalerl.dev", "scalerlruns", "create"),
    ("scalerl.dev", "scalerlruns", "delete"),
}
# Used only by a run in a Kueue queue (test_queue.py checks them against the audit log).
ON_QUEUE = {
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("jobset.x-k8s.io", "jobsets", "create"),
    ("jobset.x-k8s.io", "jobsets", "delete"),
    ("kueue.x-k8s.io", "workloads", "list"),
}
# Used only by a run with an OpenEnv server's image (test_openenv_server.py checks them against
# the audit log).
ON_OPENENV = {("apps", "deployments", verb) for verb in ("get", "create", "patch", "delete")}
# Used only when a run's spec changes what its pods reach (test_operator.py's first test checks
# that the policies follow the spec).
ON_POLICY_CHANGE = {("networking.k8s.io", "networkpolicies", "patch")}
ON_FEATURE = ON_REFUSAL | ON_QUEUE | ON_SWEEP | ON_OPENENV | ON_POLICY_CHANGE


def a_runs_whole_life(plane: ControlPlane, ns: str) -> None:
    """Create, run, replace a generator, scale the generators, fail and restart, fit, suspend
    and resume, stop on the prediction, delete."""
    stop = {"predictedABelow": 0.5, "minPoints": 8}
    create_run(plane, ns, run_manifest(ns, fit={"everyEvaluations": 2}, budget={"stopWhen": stop}))
    gang = gang_up(plane, ns, 0)
    set_running(plane, ns, gang)
    wait_for(lambda: phase_is(plane, ns, "Running"), "Running")
    set_phase(plane, ns, of_role(gang, "generator"), "Failed", exit_code=1)  # replaced alone
    wait_for(lambda: (status(plane, ns).get("generators") or {}).get("replaced") == 1, "replaced")
    patch_run(plane, ns, {"generators": {"replicas": 3}})  # its generators' Job resized
    wait_for(lambda: events(plane, ns, "GeneratorsScaled"), "the generators scaled")
    set_phase(plane, ns, of_role(gang, "trainer"), "Failed", exit_code=1)  # the gang restarts
    gang = gang_up(plane, ns, 1, size=4)
    points = [{"step": i, "computeHours": 1.0 + i, "passRate": 0.2} for i in range(2)]
    patch_run_status(plane, ns, {"evaluations": points, "evaluationCount": 2})
    (fit,) = wait_for(lambda: pods(plane, ns, role="fit"), "the fit Job's pod")
    set_phase(plane, ns, fit, "Succeeded", exit_code=0)
    patch_run(plane, ns, {"suspend": True})
    wait_for(lambda: phase_is(plane, ns, "Suspended"), "Suspended")
    patch_run(plane, ns, {"suspend": False})
    gang = gang_up(plane, ns, 1, size=4)
    hopeless = {"A": 0.3, "B": 1.5, "C_mid": 10.0, "R0": 0.1, "A_interval": [0.28, 0.33]}
    hopeless |= {"predictedAtBudget": 0.3, "predictedAtBudgetInterval": [0.28, 0.33]}
    patch_run_status(plane, ns, {"prediction": {**hopeless, "points": 8, "confidence": "OK"}})
    wait_for(lambda: phase_is(plane, ns, "Failed"), "stopped by its prediction")
    # A pod of the run that no Job owns (a leftover): the operator deletes it itself.
    create_pod(plane, ns, bare_pod(ns, "r1-generator-0-stray", like=gang[0]))
    delete_run(plane, ns)
    wait_for(lambda: owned(plane, ns) == {}, "no children")


def refused(events: list[dict[str, Any]], user: str) -> list[str]:
    """`user`'s requests the API server answered 403."""
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in events
        if e["user"]["username"] == user and e["responseStatus"]["code"] == 403
    ]


def used(events: list[dict[str, Any]], user: str = OPERATOR_USER) -> set[Permission]:
    """What RBAC had to grant for `user`'s resource requests (discovery and other non-resource
    URLs need nothing: every authenticated user may read them)."""
    out = set()
    for event in events:
        ref = event.get("objectRef")
        if event["user"]["username"] != user or not ref or "resource" not in ref:
            continue
        resource = "/".join(filter(None, (ref["resource"], ref.get("subresource"))))
        out.add((ref.get("apiGroup", ""), resource, event["verb"]))
    return out


RBAC = "/apis/rbac.authorization.k8s.io/v1"


def granted(
    plane: ControlPlane, path: str = f"{RBAC}/clusterroles/{OPERATOR_ACCOUNT}"
) -> set[Permission]:
    """The rules of a role `helm install` made for the operator (default: the ClusterRole)."""
    code, role = plane.api("GET", path)
    assert code == 200, role
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_cluster_role_is_exactly_what_the_operator_uses(
    plane: ControlPlane, operator_kubeconfig: Path, ns: str
) -> None:
    ensure_crd(plane)
    since = time.time()
    with in_thread(plane, operator_kubeconfig, namespaces=[]):
        a_runs_whole_life(plane, ns)
    events = requests(plane, since)
    assert refused(events, OPERATOR_USER) == [], "requests the chart's ClusterRole refuses"
    allowed = granted(plane)
    assert used(events) - allowed == set(), "requests the chart's ClusterRole refuses"
    unused = allowed - used(events)
    assert ADMISSION_ONLY <= unused <= ADMISSION_ONLY | ON_FEATURE, "permissions never used"


def test_the_cluster_role_has_no_wildcards_or_names(
    plane: ControlPlane, operator_kubeconfig: Path
) -> None:
    code, role = plane.api(
        "GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{OPERATOR_ACCOUNT}"
    )
    assert code == 200, role
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "resourceNames" not in rule  # runs and their children are named by users


TEAM, TEAM_NAMESPACE = "scalerl-team", "team-system"
TEAM_USER = f"system:serviceaccount:{TEAM_NAMESPACE}:{TEAM}"


def test_a_namespaced_install_grants_a_role_in_each_watched_namespace_only(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    # A second install, as a team would make it: its operator watches `ns` alone, and its pods
    # name no user IDs (the platform's to assign, as on OpenShift).
    ensure_crd(plane)
    values = ["--set", f"operator.watchNamespaces={{{ns}}}", "--set", "podSecurity.runAsUser=null"]
    done = helm(
        plane, "install", TEAM, str(CHART), "-n", TEAM_NAMESPACE, "--create-namespace", *values
    )
    assert done.returncode == 0, done.stderr
    try:
        kubeconfig = account_kubeconfig(plane, TEAM_NAMESPACE, TEAM, tmp_path)
        since = time.time()
        with in_thread(plane, kubeconfig, [ns], images=Images(run_as=None)):
            a_runs_whole_life(plane, ns)  # its pods pass the namespace's restricted Pod Security
        events = requests(plane, since)
        assert refused(events, TEAM_USER) == [], "requests the namespaced install refuses"
        cluster_wide = granted(plane, f"{RBAC}/clusterroles/{TEAM}")
        assert cluster_wide == {
            ("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")
        }
        in_ns = granted(plane, f"{RBAC}/namespaces/{ns}/roles/{TEAM}")
        assert used(events, TEAM_USER) - (cluster_wide | in_ns) == set()
        unused = in_ns - used(events, TEAM_USER)
        assert ADMISSION_ONLY <= unused <= ADMISSION_ONLY | ON_FEATURE

        def may(verb: str, resource: str, namespace: str) -> bool:
            answer = plane.kubectl(
                "auth", "can-i", verb, resource, "-n", namespace, "--as", TEAM_USER, check=False
            )
            return answer.strip() == "yes"

        assert may("create", "jobs.batch", ns) and not may("create", "jobs.batch", "default")
        assert not may("list", "pods", "default")
    finally:
        helm(plane, "uninstall", TEAM, "-n", TEAM_NAMESPACE)
