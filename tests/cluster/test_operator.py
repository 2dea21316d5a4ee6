"""The operator's behaviours on the real control plane: kopf with the operator's handlers, as the
chart's ServiceAccount, watching the test's namespace; the real Job controller making the pods and
the garbage collector removing what the operator leaves. There is no kubelet: the tests report the
pods' phases (runs.set_phase), as a kubelet would."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import OPERATOR_USER, RELEASE_NAMESPACE, in_thread
from controlplane import TEST_SCHEDULER, ControlPlane
from runs import (
    RUNS,
    bare_pod,
    condition,
    create_pod,
    create_run,
    delete_run,
    ensure_crd,
    event_reasons,
    events,
    gang_up,
    get_run,
    in_namespace,
    listed,
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
    write_pod_status,
)
from small_run import run_manifest

from scalerl.metrics import RUN_GAUGES, RunMetrics
from scalerl.operator import gang as gang_manifests
from scalerl.operator import handlers, names, network
from scalerl.operator.handlers import network_from_environ
from scalerl.operator.manifests import Images, Owner
from scalerl.operator.trackrecord import with_prediction
from scalerl.spec import parse_run

CHILDREN = {
    "configmaps": ["r1-config"],
    "jobs": ["r1-generator", "r1-trainer"],
    "networkpolicies": ["r1-egress-fit", "r1-egress-trainer", "r1-network"],
    "rolebindings": ["r1-status"],
    "roles": ["r1-status"],
    "serviceaccounts": ["r1-status"],
    "secrets": ["r1-stream-keys"],
    "services": ["r1-trainer"],
}


@pytest.fixture(scope="module")
def kubeconfig(plane: ControlPlane, operator_kubeconfig: Path) -> Path:
    """The chart installed and the CRD served: the operator's kubeconfig."""
    ensure_crd(plane)
    return operator_kubeconfig


@pytest.fixture
def operator(plane: ControlPlane, kubeconfig: Path, ns: str) -> Any:
    """`with operator():` the operator watching the test's namespace (a metrics registry, or
    more namespaces, as keywords)."""

    def start(**options: Any) -> Any:
        namespaces = options.pop("namespaces", [ns])
        return in_thread(plane, kubeconfig, namespaces, **options)

    return start


def test_a_run_gets_every_child_owned_by_it(plane: ControlPlane, ns: str, operator: Any) -> None:
    with operator():
        run = create_run(plane, ns, run_manifest(ns))
        started = time.monotonic()
        wait_for(
            lambda: {k: v for k, v in owned(plane, ns).items() if k != "pods"} == CHILDREN,
            "every child",
        )
        elapsed = time.monotonic() - started
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting")
        event_reasons(plane, ns, "Created")
    uid = run["metadata"]["uid"]
    for resource in CHILDREN:
        for child in listed(plane, ns, resource):
            refs = child["metadata"]["ownerReferences"]
            owners = [(r["kind"], r["uid"], r["controller"], r["blockOwnerDeletion"]) for r in refs]
            assert owners == [("ScaleRLRun", uid, True, True)]
    assert condition(plane, ns, "Ready")["status"] == "True"  # type: ignore[index]
    assert status(plane, ns)["observedGeneration"] == run["metadata"]["generation"]
    # The real Job controller made the gang's pods: one per index, owned by their Jobs.
    gang = gang_up(plane, ns, 0)
    indexes = [p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in gang]
    assert sorted(indexes) == ["0", "0", "1"]
    print(f"create -> every child present: {elapsed:.2f} s")
    the_policies_are_applied_and_follow_the_spec(plane, ns, operator, run)


def stored_policies(plane: ControlPlane, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p["spec"] for p in listed(plane, ns, "networkpolicies")}


def the_policies_are_applied_and_follow_the_spec(
    plane: ControlPlane, ns: str, operator: Any, run: dict[str, Any]
) -> None:
    """The API server validated and stored the run's policies as the operator built them (so the
    periodic check patches nothing), and the chart's over the operator's pod, with the API
    server's addresses `helm install` looked up; a spec that names a tracker and environment
    packages opens their ports to the pods that use them, and closes them when it no longer
    does."""
    owner = Owner("r1", ns, run["metadata"]["uid"])
    built = network.network_policies(parse_run(run_manifest(ns)), owner, network_from_environ())
    assert stored_policies(plane, ns) == {p["metadata"]["name"]: p["spec"] for p in built}
    code, chart_policy = plane.api(
        "GET", f"/apis/networking.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/networkpolicies/scalerl"
    )
    assert code == 200, chart_policy
    code, service = plane.api("GET", "/api/v1/namespaces/default/services/kubernetes")
    assert code == 200, service
    (api_rule, dns_rule) = chart_policy["spec"]["egress"]
    assert {"ipBlock": {"cidr": f"{service['spec']['clusterIP']}/32"}} in api_rule["to"]
    assert {"protocol": "TCP", "port": 443} in api_rule["ports"]
    assert [p["port"] for p in dns_rule["ports"]] == [53, 53]

    tracked = {
        "tracking": {"mlflow": {"uri": "http://mlflow.tools.svc:5000"}},
        "environment": {
            "openenv": {"url": "http://calculator.tools.svc:8000"},
            "packages": ["calculator-env==1.0"],
            "indexUrl": "http://pypi.tools.svc:3141/simple",
        },
    }

    def ports(name: str) -> set[int]:
        spec = stored_policies(plane, ns).get(name)
        return {p["port"] for rule in (spec or {}).get("egress", []) for p in rule["ports"]}

    with operator():
        patch_run(plane, ns, tracked)
        wait_for(lambda: 5000 in ports("r1-egress-trainer"), "the trainer's policy opens MLflow")
        wait_for(lambda: ports("r1-egress-generator") == {3141, 8000}, "the generators' policy")
        assert 5000 in ports("r1-egress-fit") and 5000 not in ports("r1-egress-generator")
        patch_run(plane, ns, {"tracking": None, "environment": None})
        wait_for(lambda: "r1-egress-generator" not in stored_policies(plane, ns), "no packages")
        wait_for(lambda: 5000 not in ports("r1-egress-trainer"), "no tracker")


# --- a spec only the operator sees is bad --------------------------------------------------------

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/scalerlruns.scalerl.dev"


@contextlib.contextmanager
def crd_without_rules(plane: ControlPlane, ns: str, probe: dict[str, Any]) -> Iterator[None]:
    """The CRD with no schema for `spec` for the length of the block, as a CRD older than the
    operator leaves a spec unchecked (helm never upgrades a chart's crds/); the server's own
    validation would refuse `probe` before the operator ever saw it. The CRD is whole again
    after the block, and refuses `probe` again."""
    code, crd = plane.api("GET", CRD_PATH)
    assert code == 200, crd
    version = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    rules = copy.deepcopy(version["spec"])
    loose = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    _set_spec_schema(plane, loose)
    probe = {**probe, "metadata": {**probe["metadata"], "name": "probe"}}
    admits = lambda: plane.api("POST", f"{RUNS}/{ns}/scalerlruns?dryRun=All", probe)[0] == 201  # noqa: E731
    try:
        wait_for(admits, "the server serving the CRD without rules")
        yield
    finally:
        _set_spec_schema(plane, rules)
    wait_for(lambda: not admits(), "the server serving the whole CRD again")


def _set_spec_schema(plane: ControlPlane, schema: dict[str, Any]) -> None:
    code, crd = plane.api("GET", CRD_PATH)
    assert code == 200, crd
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = schema
    code, body = plane.api("PUT", CRD_PATH, crd)
    assert code == 200, body


def test_a_bad_spec_is_reported_field_by_field_and_nothing_is_created(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    bad = run_manifest(ns, recipe={"loss": {"type": "ppo"}, "batch": {"prompts": 0}})
    with crd_without_rules(plane, ns, bad):
        create_run(plane, ns, bad)
    with operator():
        ready = wait_for(lambda: condition(plane, ns, "Ready"), "Ready")
        wait_for(lambda: events(plane, ns, "InvalidSpec"), "the InvalidSpec event")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    lines = ready["message"].splitlines()
    assert any(line.startswith("spec.recipe.loss.type:") for line in lines)
    assert any(line.startswith("spec.recipe.batch.prompts:") for line in lines)
    assert len(lines) == 2
    assert owned(plane, ns) == {}


def test_a_fixed_spec_starts_the_run(plane: ControlPlane, ns: str, operator: Any) -> None:
    # The recipe is immutable on the server: the fix is to a field a user may change.
    bad = run_manifest(ns, fit={"everyEvaluations": 0})
    with crd_without_rules(plane, ns, bad):
        create_run(plane, ns, bad)
    with operator():
        wait_for(lambda: (condition(plane, ns, "Ready") or {}).get("status") == "False", "bad")
        assert owned(plane, ns) == {}
        patch_run(plane, ns, {"fit": {"everyEvaluations": 3}})
        wait_for(lambda: (condition(plane, ns, "Ready") or {}).get("status") == "True", "fixed")
        wait_for(lambda: "jobs" in owned(plane, ns), "the gang's Jobs")


# --- where the pods run --------------------------------------------------------------------------

GPU_POOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPREAD = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"scalerl.dev/role": "generator"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
}


@pytest.fixture
def cluster_classes(plane: ControlPlane) -> Iterator[tuple[str, str]]:
    """A PriorityClass and a RuntimeClass: the server refuses a pod that names a missing one."""
    priority, runtime = "scalerl-test-gang", "scalerl-test-nvidia"
    plane.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": priority},
                    "value": 100000,
                },
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": runtime},
                    "handler": "nvidia",
                },
            ]
        ),
    )
    yield priority, runtime


def test_the_scheduling_of_a_run_and_of_each_role_reaches_their_pods(
    plane: ControlPlane, ns: str, operator: Any, cluster_classes: tuple[str, str]
) -> None:
    priority, runtime = cluster_classes
    run = run_manifest(
        ns,
        scheduling={
            "nodeSelector": {"gpu.example.com/type": "h100"},
            "tolerations": [GPU_POOL],
            "priorityClassName": priority,
        },
        trainers={"scheduling": {"runtimeClassName": runtime}},
        generators={
            "scheduling": {
                "tolerations": [{**GPU_POOL, "key": "example.com/spot"}],
                "affinity": SPREAD,
            },
            "resources": {"requests": {"memory": "48Gi"}},
        },
        # A claim that ignores fsGroup: an init container makes runs/r1 as the pods' user.
        checkpoint={"claimName": "ckpt", "createRunDirectory": True},
        podSecurity={"runAsUser": None},  # the platform's to assign, as on OpenShift
    )
    with operator():
        create_run(plane, ns, run)
        gang = gang_up(plane, ns, 0)
    trainer, generator = (of_role(gang, role)["spec"] for role in ("trainer", "generator"))
    # The run's fields where a role says nothing; a role's field replaces the run's whole.
    assert trainer["nodeSelector"] == generator["nodeSelector"] == {"gpu.example.com/type": "h100"}
    assert GPU_POOL in trainer["tolerations"]
    assert GPU_POOL not in generator["tolerations"]
    assert {**GPU_POOL, "key": "example.com/spot"} in generator["tolerations"]
    assert generator["affinity"] == SPREAD and "affinity" not in trainer
    assert trainer["runtimeClassName"] == runtime and "runtimeClassName" not in generator
    # The server resolved the class: its Priority admission copied the value into the pods.
    assert trainer["priorityClassName"] == generator["priorityClassName"] == priority
    assert trainer["priority"] == generator["priority"] == 100000
    # A GPU pod requests CPU and memory per GPU where its resources do not say.
    limits = {"nvidia.com/gpu": "1"}
    trainer_resources = trainer["containers"][0]["resources"]
    assert trainer_resources == {
        "requests": {**limits, "cpu": "4", "memory": "32Gi"},
        "limits": limits,
    }
    assert generator["containers"][0]["resources"]["requests"]["memory"] == "48Gi"
    shm = next(v for v in trainer["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    # Admitted under the namespace's restricted Pod Security, init container included, with no
    # user ID of their own.
    for pod in (trainer, generator):
        assert pod["initContainers"][0]["command"] == ["mkdir", "-p", "/store/runs/r1"]
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }


# --- the gang ------------------------------------------------------------------------------------


def pulling(pod: dict[str, Any], reason: str) -> dict[str, Any]:
    """A kubelet's account of a container whose image it cannot pull."""
    image = pod["spec"]["containers"][0]["image"]
    waiting = {"reason": reason, "message": f'Back-off pulling image "{image}"'}
    container = {"name": pod["spec"]["containers"][0]["name"], "image": image, "imageID": ""}
    return {
        "phase": "Pending",
        "containerStatuses": [
            {**container, "ready": False, "restartCount": 0, "state": {"waiting": waiting}}
        ],
    }


# The trainer goes to the real scheduler with a node selector no node matches. (No claim, which
# the scheduler would find missing first; and the test node's not-ready taint, which the API
# server put on it, is tolerated, so that the selector is what the scheduler turns down.)
NOWHERE = {
    "checkpoint": {"claimName": None},
    "trainers": {
        "scheduling": {
            "schedulerName": TEST_SCHEDULER,
            "nodeSelector": {"gpu.example.com/type": "none-such"},
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        }
    },
}
SCHEDULER_SAYS = "didn't match Pod's node affinity/selector"


def test_a_starting_gang_says_what_its_pods_wait_for_and_uses_no_restart(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns, failurePolicy={"maxRestarts": 0}, **NOWHERE))
        gang = gang_up(plane, ns, 0)

        def pods_ready() -> dict[str, Any]:
            return condition(plane, ns, "PodsReady") or {}

        # The scheduler turns the trainer down: the run says so, in the scheduler's words.
        wait_for(lambda: pods_ready().get("reason") == "Unschedulable", "Unschedulable")
        assert phase_is(plane, ns, "Starting")
        assert SCHEDULER_SAYS in pods_ready()["message"]
        # A generator's image cannot be pulled (the first pod in order: the gang's reason now).
        generator = of_role(gang, "generator")
        write_pod_status(plane, ns, generator, pulling(generator, "ImagePullBackOff"))
        wait_for(lambda: pods_ready().get("reason") == "ImagePullBackOff", "ImagePullBackOff")
        image = generator["spec"]["containers"][0]["image"]
        assert pods_ready()["status"] == "False"
        assert f'Back-off pulling image "{image}"' in pods_ready()["message"]
        assert pods_ready()["message"].startswith("0 of 3 pods running; pod r1-generator-")
        wide = plane.kubectl("get", "srl", "-n", ns, "-o", "wide").splitlines()
        assert "MESSAGE" in wide[0].split() and "ImagePullBackOff" in wide[1]
        # The image arrives: what holds the gang is the scheduler's answer again.
        set_phase(plane, ns, generator, "Running")
        wait_for(lambda: pods_ready().get("reason") == "Unschedulable", "Unschedulable again")
        # A trainer lost while starting (evicted, preempted) restarts the gang without using up
        # a restart, though maxRestarts is 0.
        set_phase(plane, ns, of_role(gang, "trainer"), "Failed", exit_code=137)
        gang = gang_up(plane, ns, 1)
        assert phase_is(plane, ns, "Starting")
        assert (status(plane, ns)["restarts"], status(plane, ns)["startupRestarts"]) == (1, 1)
        wait_for(lambda: pods_ready().get("reason") == "Unschedulable", "the new trainer held")
        set_running(plane, ns, gang)  # the cluster made room
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running")
        assert pods_ready()["status"] == "True"
        event_reasons(
            plane, ns, "Created", "Unschedulable", "ImagePullBackOff", "Unschedulable",
            "GangRestart", "Unschedulable", "Running",
        )  # fmt: skip
        # Running, a failure counts: with maxRestarts 0 the run ends.
        set_phase(plane, ns, of_role(gang, "trainer"), "Failed", exit_code=1)
        wait_for(lambda: phase_is(plane, ns, "Failed"), "Failed")


def test_pods_the_cluster_refuses_to_create_are_named_with_its_reason(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    # A team quota of two pods; the gang needs three: the Job controller cannot create the third.
    quota = {"metadata": {"name": "team"}, "spec": {"hard": {"pods": "2"}}}
    code, body = plane.api("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    assert code == 201, body
    path = f"/api/v1/namespaces/{ns}/resourcequotas/team"
    wait_for(lambda: plane.api("GET", path)[1].get("status", {}).get("hard"), "the quota counted")
    # The refusal comes with no pod event: the periodic check is what reads it.
    with operator(check_interval_s=1.0):
        create_run(plane, ns, run_manifest(ns))
        wait_for(
            lambda: (condition(plane, ns, "PodsReady") or {}).get("reason") == "FailedCreate",
            "FailedCreate",
        )
        message = condition(plane, ns, "PodsReady")["message"]  # type: ignore[index]
        assert message.startswith("0 of 3 pods running; Error creating: pods ")
        assert "exceeded quota: team" in message
        assert phase_is(plane, ns, "Starting")
        event_reasons(plane, ns, "Created", "FailedCreate")


def test_pods_pod_security_refuses_are_named_with_its_admission_message(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    # An operator whose pods run as root (the chart refuses that value; a hand-made deployment
    # might not): the namespace's `restricted` Pod Security refuses every pod.
    with operator(check_interval_s=1.0, images=Images(run_as=0)):
        create_run(plane, ns, run_manifest(ns))
        wait_for(
            lambda: (condition(plane, ns, "PodsReady") or {}).get("reason") == "FailedCreate",
            "FailedCreate",
        )
        message = condition(plane, ns, "PodsReady")["message"]  # type: ignore[index]
        assert 'violates PodSecurity "restricted:latest"' in message, message
        assert "runAsUser=0" in message and phase_is(plane, ns, "Starting")


def test_a_volume_a_pod_cannot_get_is_named_with_the_controllers_words(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    # Every pod scheduled and held in ContainerCreating: its status says nothing of why. The
    # attach-detach controller's Warning Event does, and the periodic check reads it.
    with operator(check_interval_s=1.0):
        create_run(plane, ns, run_manifest(ns))
        gang = gang_up(plane, ns, 0)
        for pod in gang:
            write_pod_status(plane, ns, pod, pulling(pod, "ContainerCreating"))
        wait_for(
            lambda: (condition(plane, ns, "PodsReady") or {}).get("reason") == "PodsStarting",
            "pods on their way",
        )
        trainer = of_role(gang, "trainer")
        multi_attach = (
            'Multi-Attach error for volume "pvc-0c1d" Volume is already exclusively attached to '
            "one node and can't be attached to another"
        )
        warn(plane, ns, trainer, "FailedAttachVolume", multi_attach, "attachdetach-controller")
        wait_for(
            lambda: (condition(plane, ns, "PodsReady") or {}).get("reason") == "FailedAttachVolume",
            "FailedAttachVolume",
        )
        message = condition(plane, ns, "PodsReady")["message"]  # type: ignore[index]
        assert message == f"0 of 3 pods running; pod {trainer['metadata']['name']}: {multi_attach}"
        assert phase_is(plane, ns, "Starting")
        event_reasons(plane, ns, "Created", "FailedAttachVolume")
        # The volume attaches (the other pod let go of it): the gang runs.
        set_running(plane, ns, gang)
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running")


def warn(
    plane: ControlPlane, ns: str, pod: dict[str, Any], reason: str, message: str, component: str
) -> None:
    """A Warning Event about `pod`, as a controller or the kubelet posts it."""
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {"kind": "Pod", "namespace": ns} | {k: meta[k] for k in ("name", "uid")},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    code, body = plane.api("POST", f"/api/v1/namespaces/{ns}/events", event)
    assert code == 201, body


def test_a_gang_that_does_not_start_in_time_ends_the_run(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator(check_interval_s=1.0):
        create_run(plane, ns, run_manifest(ns, **NOWHERE))
        gang_up(plane, ns, 0)
        wait_for(
            lambda: (condition(plane, ns, "PodsReady") or {}).get("reason") == "Unschedulable",
            "Unschedulable",
        )
        assert phase_is(plane, ns, "Starting")  # within the default 30 minutes
        # The user shortens the wait (failurePolicy may change on a live run).
        patch_run(plane, ns, {"failurePolicy": {"startupTimeoutSeconds": 1}})
        wait_for(lambda: phase_is(plane, ns, "Failed"), "Failed")
        wait_for(lambda: not pods(plane, ns) and "jobs" not in owned(plane, ns), "no gang")
    ready = condition(plane, ns, "Ready") or {}
    assert ready["reason"] == "StartupTimeout"
    assert "within 1 s (failurePolicy.startupTimeoutSeconds)" in ready["message"]
    assert SCHEDULER_SAYS in ready["message"]


def running(plane: ControlPlane, ns: str, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The run `manifest` created, its first gang's pods running and the run Running: the
    gang's pods."""
    create_run(plane, ns, manifest)
    gang = gang_up(plane, ns, 0)
    set_running(plane, ns, gang)
    wait_for(lambda: phase_is(plane, ns, "Running"), "Running")
    return gang


def test_a_failed_pod_restarts_the_gang_until_the_bound_then_fails(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        gang = running(plane, ns, run_manifest(ns, failurePolicy={"maxRestarts": 2}))
        for attempt in (1, 2):
            set_phase(plane, ns, of_role(gang, "trainer"), "Failed", exit_code=1)
            gang = gang_up(plane, ns, attempt)
            assert status(plane, ns)["restarts"] == attempt
            set_running(plane, ns, gang)
            wait_for(lambda: phase_is(plane, ns, "Running"), "Running again")
        set_phase(plane, ns, of_role(gang, "trainer"), "Failed", exit_code=137)
        wait_for(lambda: phase_is(plane, ns, "Failed"), "Failed")
        wait_for(lambda: not pods(plane, ns) and "jobs" not in owned(plane, ns), "no gang")
        event_reasons(
            plane, ns, "Created", "Running", "GangRestart", "Running", "GangRestart", "Running",
            "RestartLimitExceeded",
        )  # fmt: skip
    final = status(plane, ns)
    assert final["restarts"] == 2
    assert "exit code 137" in final["message"] and "maxRestarts" in final["message"]
    assert condition(plane, ns, "Ready")["reason"] == "RestartLimitExceeded"  # type: ignore[index]


def cell(header: str, row: str, column: str) -> str:
    """One cell of a `kubectl get` table (left-aligned columns, some cells with spaces)."""
    start = header.index(f" {column} ") + 1
    return row[start:].split()[0]


def generators(plane: ControlPlane, ns: str) -> dict[str, Any]:
    return dict(status(plane, ns).get("generators") or {})


def generator_pod(
    plane: ControlPlane, ns: str, index: int, attempt: int = 0, *, not_: str = ""
) -> dict[str, Any] | None:
    """Generator `index`'s pod of gang `attempt` that has not failed (and is not `not_`)."""
    for pod in pods(plane, ns, role="generator"):
        labels, name = pod["metadata"]["labels"], pod["metadata"]["name"]
        if (
            (labels.get(names.LABEL_JOB_INDEX), labels.get(names.LABEL_ATTEMPT)) == (
                str(index), str(attempt))
            and name != not_
            and (pod.get("status") or {}).get("phase") != "Failed"
        ):  # fmt: skip
            return pod
    return None


def running_with_two_generators(plane: ControlPlane, ns: str) -> None:
    """A run r1 whose gang runs, its 2 generators counted ready."""
    running(plane, ns, run_manifest(ns))
    wait_for(lambda: generators(plane, ns).get("ready") == 2, "2 generators ready")


def test_a_generator_pod_trainer_0_gave_up_is_deleted_and_replaced(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    """Trainer 0 gave generator 1 up (it sent nothing for the peer timeout while generator 0
    did: a frozen process reads no Stop) and lists its pod in status.generatorsGivenUp: the
    operator deletes that pod (its Job replaces it, as any deleted generator's) and the entry
    goes. An entry naming a pod that is not one of the run's generators deletes nothing."""
    with operator():
        running_with_two_generators(plane, ns)
        frozen = generator_pod(plane, ns, 1)
        trainer = of_role(pods(plane, ns), "trainer")
        assert frozen is not None
        name = frozen["metadata"]["name"]
        reason = "no rollouts for 300 s (the peer timeout) while the others sent theirs"
        patch_run_status(plane, ns, {"generatorsGivenUp": [
            {"index": 1, "pod": name, "reason": reason},
            {"index": 0, "pod": trainer["metadata"]["name"], "reason": "mistaken"},
        ]})  # fmt: skip
        wait_for(lambda: "generatorsGivenUp" not in status(plane, ns), "the entries cleared")
        # Deleted (here no kubelet ends it: it keeps a deletion mark; its Job replaces it once
        # it is gone, as the cluster end-to-end test's deleted generator shows).
        assert all(p["metadata"]["name"] != name for p in pods(plane, ns))
        assert trainer["metadata"]["name"] in {p["metadata"]["name"] for p in pods(plane, ns)}
        (given_up,) = events(plane, ns, "GeneratorGivenUp")
        assert given_up["message"] == (
            f"generator 1 stopped answering ({reason}); its pod {name} is deleted so that its "
            "Job replaces it"
        )
        assert phase_is(plane, ns, "Running") and status(plane, ns)["restarts"] == 0


def test_a_failed_generator_is_replaced_alone_until_it_fails_again_before_a_step(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        running_with_two_generators(plane, ns)
        patch_run_status(plane, ns, {"progress": {"step": 3}})  # trainer 0 at step 3

        # Generator 0 is killed (OOM, SIGKILL): its Job makes a pod of the same index (after
        # the Job controller's retry back-off) and the gang trains on, no restart used.
        first = generator_pod(plane, ns, 0)
        assert first is not None
        set_phase(plane, ns, first, "Failed", exit_code=137)
        wait_for(lambda: generators(plane, ns).get("replaced") == 1, "one generator replaced")
        wait_for(lambda: generators(plane, ns).get("ready") == 1, "one generator ready")
        second = wait_for(
            lambda: generator_pod(plane, ns, 0, not_=first["metadata"]["name"]),
            "generator 0's replacement",
        )
        set_phase(plane, ns, second, "Running")
        wait_for(lambda: generators(plane, ns).get("ready") == 2, "2 generators ready again")
        assert phase_is(plane, ns, "Running") and status(plane, ns)["restarts"] == 0
        assert generators(plane, ns) == {
            "desired": 2,
            "ready": 2,
            "replaced": 1,  # once, though its pod changed again after it failed
            "failures": {"0": {"pod": first["metadata"]["name"], "nth": 0, "step": 3}},
        }
        (replaced,) = events(plane, ns, "GeneratorReplaced")
        assert replaced["message"].startswith(f"pod {first['metadata']['name']} failed: exit")
        assert "exit code 137" in replaced["message"]
        assert "generator 0 is replaced alone and training goes on" in replaced["message"]
        header, row = plane.kubectl("get", "srl", "-n", ns, "-o", "wide").splitlines()
        assert (cell(header, row, "GENS"), cell(header, row, "REPLACED")) == ("2", "1")

        # The trainer trained on: the replacement failing is replaced too.
        patch_run_status(plane, ns, {"progress": {"step": 4}})
        set_phase(plane, ns, second, "Failed", exit_code=1)
        wait_for(lambda: generators(plane, ns).get("replaced") == 2, "generator 0 again")

        # Generator 1 fails, and its replacement fails again before the trainer trained another
        # step: it would only fail again, so the gang restarts from its checkpoint.
        third = generator_pod(plane, ns, 1)
        assert third is not None
        set_phase(plane, ns, third, "Failed", exit_code=1)
        wait_for(lambda: generators(plane, ns).get("replaced") == 3, "generator 1 replaced")
        fourth = wait_for(
            lambda: generator_pod(plane, ns, 1, not_=third["metadata"]["name"]),
            "generator 1's replacement",
        )
        set_phase(plane, ns, fourth, "Failed", exit_code=1)
        gang_up(plane, ns, 1)
        assert status(plane, ns)["restarts"] == 1
        assert generators(plane, ns) == {"desired": 2, "ready": 0, "replaced": 3, "failures": {}}
        event_reasons(
            plane, ns, "Created", "Running", "GeneratorReplaced", "GeneratorReplaced",
            "GeneratorReplaced", "GangRestart",
        )  # fmt: skip
        restart = events(plane, ns, "GangRestart")[-1]["message"]
        assert f"pod {fourth['metadata']['name']} failed: exit code 1" in restart
        assert "generator 1 failed again before a step was trained since it was last" in restart


def test_a_generator_past_its_retries_fails_its_job_and_restarts_the_gang(
    plane: ControlPlane, ns: str, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gang_manifests, "GENERATOR_RETRIES", 0)  # the first failure is its last
    with operator():
        gang = running(plane, ns, run_manifest(ns))
        set_phase(plane, ns, of_role(gang, "generator"), "Failed", exit_code=1)
        gang_up(plane, ns, 1)
        assert status(plane, ns)["restarts"] == 1
        restart = events(plane, ns, "GangRestart")[-1]["message"]
        assert restart.startswith("job r1-generator failed: MaxFailedIndexesExceeded"), restart


def generator_job(plane: ControlPlane, ns: str) -> dict[str, Any]:
    code, job = plane.api("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/r1-generator")
    assert code == 200, job
    return dict(job)


def test_kubectl_scale_resizes_the_generators_job_while_the_gang_runs(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    """`kubectl scale srl/r1 --replicas=3`, then 1: the generators' Job takes each size while
    the gang runs (the Job controller makes index 2's pod, then removes indexes 1 and 2), with
    no gang restart and no generator counted as replaced."""
    with operator():
        running_with_two_generators(plane, ns)

        plane.kubectl("scale", "-n", ns, "srl/r1", "--replicas=3")
        third = wait_for(lambda: generator_pod(plane, ns, 2), "generator 2's pod")
        spec = generator_job(plane, ns)["spec"]
        assert (spec["completions"], spec["parallelism"]) == (3, 3)
        set_phase(plane, ns, third, "Running")
        wait_for(lambda: generators(plane, ns) == {"desired": 3, "ready": 3}, "3 ready")
        (scaled,) = events(plane, ns, "GeneratorsScaled")
        assert scaled["message"] == "generators 2 -> 3 while the gang runs; training goes on"

        plane.kubectl("scale", "-n", ns, "srl/r1", "--replicas=1")
        wait_for(lambda: generator_job(plane, ns)["spec"]["completions"] == 1, "the Job at 1")
        # The Job controller deletes indexes 1 and 2; their processes end on SIGTERM (143).
        for index in (1, 2):
            pod = generator_pod(plane, ns, index)
            if pod is not None:
                set_phase(plane, ns, pod, "Failed", exit_code=143)
        wait_for(lambda: generators(plane, ns) == {"desired": 1, "ready": 1}, "1 ready")
        assert generator_job(plane, ns)["spec"]["parallelism"] == 1
        assert phase_is(plane, ns, "Running") and status(plane, ns)["restarts"] == 0
        assert events(plane, ns, "GeneratorReplaced") == []
        header, row = plane.kubectl("get", "srl", "-n", ns).splitlines()
        assert cell(header, row, "GENS") == "1"
        scale = json.loads(plane.kubectl("get", "--raw", scale_path(ns)))
        assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1)
        event_reasons(plane, ns, "Created", "Running", "GeneratorsScaled", "GeneratorsScaled")


def scale_path(ns: str) -> str:
    return f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns/r1/scale"


def test_a_colocated_run_is_one_pod_restarted_and_removed_alone(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    colocated = run_manifest(ns, placement="colocated", generators={"replicas": 1})
    with operator():
        create_run(plane, ns, colocated)
        (pod,) = gang_up(plane, ns, 0, size=1)
        assert owned(plane, ns)["jobs"] == ["r1-trainer"]
        assert pod["spec"]["containers"][0]["command"] == ["scalerl", "colocated"]
        set_phase(plane, ns, pod, "Running")
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running")
        set_phase(plane, ns, pod, "Failed", exit_code=1)
        (pod,) = gang_up(plane, ns, 1, size=1)
        assert status(plane, ns)["restarts"] == 1
        assert owned(plane, ns)["jobs"] == ["r1-trainer"]
        set_phase(plane, ns, pod, "Running")
        wait_for(lambda: phase_is(plane, ns, "Running"), "Running again")
        event_reasons(plane, ns, "Created", "Running", "GangRestart", "Running")
        delete_run(plane, ns)
        wait_for(lambda: owned(plane, ns) == {}, "no children")


def test_a_pod_of_an_old_gang_failing_restarts_nothing(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns))
        old = gang_up(plane, ns, 0)
        set_phase(plane, ns, of_role(old, "trainer"), "Failed", exit_code=1)
        gang = gang_up(plane, ns, 1)
        # A pod of gang 0 that outlived it (its node came back, say), failing now.
        stale = create_pod(plane, ns, bare_pod(ns, "stale", like=old[1]))
        set_phase(plane, ns, stale, "Failed", exit_code=1)
        time.sleep(1.0)  # nothing may happen: give the operator the time to do it wrongly
        assert status(plane, ns)["restarts"] == 1
        now = [p for p in pods(plane, ns) if p["metadata"]["name"] != "stale"]
        assert sorted(p["metadata"]["uid"] for p in now) == sorted(
            p["metadata"]["uid"] for p in gang
        )


def test_suspend_removes_the_pods_and_resume_starts_them_again(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns))
        gang_up(plane, ns, 0)
        patch_run(plane, ns, {"suspend": True})
        wait_for(lambda: phase_is(plane, ns, "Suspended"), "Suspended")
        wait_for(lambda: not pods(plane, ns) and "jobs" not in owned(plane, ns), "no gang")
        assert condition(plane, ns, "Suspended")["status"] == "True"  # type: ignore[index]
        assert "configmaps" in owned(plane, ns)  # the run's config (and checkpoints) stay
        patch_run(plane, ns, {"suspend": False})
        gang_up(plane, ns, 0)
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting")
        event_reasons(plane, ns, "Created", "Suspended", "Resumed")
    assert condition(plane, ns, "Suspended")["status"] == "False"  # type: ignore[index]
    assert status(plane, ns)["restarts"] == 0


def test_the_trainer_finishing_ends_the_run_succeeded(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        gang = running(plane, ns, run_manifest(ns))
        set_phase(plane, ns, of_role(gang, "trainer"), "Succeeded", exit_code=0)
        wait_for(lambda: phase_is(plane, ns, "Succeeded"), "Succeeded")
        wait_for(lambda: not pods(plane, ns) and "jobs" not in owned(plane, ns), "no gang")
        event_reasons(plane, ns, "Created", "Running", "BudgetReached")


def test_an_operator_restart_creates_no_duplicates(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns))
        gang_up(plane, ns, 0)
        event_reasons(plane, ns, "Created")
    before = owned(plane, ns)
    restarted = time.time()

    def creates() -> list[tuple[str, int]]:
        return [
            (e["objectRef"]["resource"], e["responseStatus"]["code"])
            for e in requests(plane, restarted)
            if e["user"]["username"] == OPERATOR_USER
            and e["verb"] == "create"
            and in_namespace(e, ns)
        ]

    with operator():
        # The resume handler runs at start; its first create is the keys Secret's.
        wait_for(creates, "the resume handler")
        time.sleep(1.0)  # let it (not) create anything else
        assert owned(plane, ns) == before
    # The keys Secret is never read, only created: the server answers 409, nothing is made.
    assert creates() == [("secrets", 409)]


# --- fits and the prediction ---------------------------------------------------------------------


def evaluations(count: int) -> dict[str, Any]:
    points = [
        {"step": 10 * i, "computeHours": 1.0 + i, "passRate": round(0.2 + 0.01 * i, 6)}
        for i in range(count)
    ]
    return {"evaluations": points, "evaluationCount": count}


def fit_jobs(plane: ControlPlane, ns: str) -> list[str]:
    return [j for j in owned(plane, ns).get("jobs", []) if "-fit-" in j]


def test_every_n_evaluations_start_one_fit_job_at_a_time(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns, fit={"everyEvaluations": 3}))
        gang_up(plane, ns, 0)
        for count in (1, 2):
            patch_run_status(plane, ns, evaluations(count))
        time.sleep(0.5)
        assert fit_jobs(plane, ns) == []
        patch_run_status(plane, ns, evaluations(3))
        wait_for(lambda: fit_jobs(plane, ns) == ["r1-fit-1"], "fit Job 1")
        for count in range(4, 8):  # the first fit still runs: no second one yet
            patch_run_status(plane, ns, evaluations(count))
        time.sleep(0.5)
        assert fit_jobs(plane, ns) == ["r1-fit-1"]
        (fit_pod,) = wait_for(lambda: pods(plane, ns, role="fit"), "the fit Job's pod")
        set_phase(plane, ns, fit_pod, "Succeeded", exit_code=0)  # the Job controller completes it
        wait_for(lambda: fit_jobs(plane, ns) == ["r1-fit-1", "r1-fit-2"], "fit Job 2")
    (job,) = [j for j in listed(plane, ns, "jobs") if j["metadata"]["name"] == "r1-fit-1"]
    assert {c["type"] for c in job["status"]["conditions"]} >= {"Complete"}
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["scalerl", "fit", "--run", "r1", "--namespace", ns]
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert status(plane, ns)["fit"] == {"jobs": 2, "evaluations": 7}


def test_a_hopeless_prediction_stops_the_run(plane: ControlPlane, ns: str, operator: Any) -> None:
    stop = {"budget": {"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}}}
    hopeless = {
        "A": 0.3,
        "B": 1.5,
        "C_mid": 100.0,
        "R0": 0.1,
        "A_interval": [0.28, 0.33],
        "predictedAtBudget": 0.3,
        # What the rule reads (scalerl.fit.decision.stop_reason): the forecast's interval at the
        # budget, wholly below predictedABelow.
        "predictedAtBudgetInterval": [0.27, 0.33],
        "budget": 1000.0,
        "points": 8,
        "confidence": "OK",
        "fittedAt": "2026-11-23T00:00:00Z",
    }
    # What two fit Jobs kept (status.trackRecord), made for the budget as set.
    budget = parse_run(run_manifest(ns, **stop)).spec.budget
    made_for = {"maxSteps": budget.max_steps, "maxComputeHours": budget.max_compute_hours}
    read = [
        {"step": 10 * i, "computeHours": 10.0 * i, "passRate": round(0.2 + 0.01 * i, 6)}
        for i in range(9)
    ]
    record = None
    for count in (5, 9):
        kept = {**hopeless, "budgetSet": made_for}
        record = with_prediction(record, kept, read[:count])
    with operator():
        create_run(plane, ns, run_manifest(ns, **stop))
        gang_up(plane, ns, 0)
        patch_run_status(plane, ns, {"evaluations": read, "trackRecord": record})
        patch_run_status(plane, ns, {"prediction": {**hopeless, "points": 7}})
        time.sleep(0.5)
        assert phase_is(plane, ns, "Starting")  # too few points to be sure
        patch_run_status(plane, ns, {"prediction": {**hopeless, "confidence": "Unchecked"}})
        time.sleep(0.5)
        assert phase_is(plane, ns, "Starting")  # nothing has checked the fit
        patch_run_status(plane, ns, {"prediction": hopeless})
        wait_for(lambda: phase_is(plane, ns, "Failed"), "stopped")
        wait_for(lambda: not pods(plane, ns) and "jobs" not in owned(plane, ns), "no gang")
    stopped = condition(plane, ns, "Stopped")
    assert stopped is not None
    assert stopped["status"] == "True" and stopped["reason"] == "PredictedBelowTarget"
    assert "0.330" in stopped["message"]
    # The run never reached its budget: its kept predictions are censored, not hits or misses,
    # with what it read when stopped and why; the API server kept every field of it.
    scored = status(plane, ns)["trackRecord"]
    assert scored["outcome"] == {
        "passRate": 0.28,
        "computeHours": 80,
        "budgetSet": made_for,
        "stopped": stopped["message"].removeprefix("stopped: "),
    }
    assert len(scored["predictions"]) == 3  # both made by 25 % of the budget: the later, thrice
    for row in scored["predictions"]:
        assert row["censored"] and row["error"] is None and row["inside"] is None
        assert row["budgetSet"] == made_for and row["actual"] == 0.28


# --- deletion, kubectl, metrics ------------------------------------------------------------------


def test_deleting_the_run_removes_every_child(plane: ControlPlane, ns: str, operator: Any) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns))
        gang_up(plane, ns, 0)
        delete_run(plane, ns)
        wait_for(lambda: owned(plane, ns) == {}, "no children")
    assert get_run(plane, ns) is None


def test_a_run_deleted_while_its_periodic_check_runs_goes_as_soon_as_the_check_ends(
    plane: ControlPlane, ns: str, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf removes a deleted run's finalizer only once the run's periodic check (a kopf timer)
    has ended, and looks again whether it has every `cancellation_polling` seconds (60 by
    default) unless an event of the run wakes it first. A check that ends having written
    nothing wakes nothing: the deletion waited out the minute (tests/cluster/test_queue.py's
    60 s `kubectl delete` timed out so). The operator looks every DELETE_POLL_S."""
    armed, entered, release = threading.Event(), threading.Event(), threading.Event()
    act = handlers.act

    def check_held_up(memo: Any, run: Any, what: Any) -> None:
        if armed.is_set() and what is handlers.lifecycle.reconcile:  # the periodic check's call
            entered.set()
            release.wait(30)
            return  # it found nothing to do: no write, no event of the run
        act(memo, run, what)

    monkeypatch.setattr(handlers, "act", check_held_up)
    with operator(check_interval_s=1.0):
        create_run(plane, ns, run_manifest(ns))
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting")
        armed.set()
        assert entered.wait(10), "the periodic check never ran"
        plane.kubectl("delete", "srl", "r1", "-n", ns, "--wait=false")
        # The delete handler runs (its cleanup takes the run's lock, which the check does not
        # hold here) and kopf writes its progress; the finalizer stays for the check.
        wait_for(lambda: owned(plane, ns).get("jobs") is None, "the delete handler's cleanup")
        time.sleep(2 * handlers.DELETE_POLL_S)
        assert get_run(plane, ns) is not None, "the finalizer went while the check ran"
        release.set()
        ended = time.monotonic()
        wait_for(lambda: get_run(plane, ns) is None, "the run gone", timeout_s=30)
        gone_s = time.monotonic() - ended
    assert gone_s < 3 * handlers.DELETE_POLL_S + 2, f"the run went {gone_s:.1f} s after the check"


def test_kubectl_get_srl_shows_the_prediction_columns(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    with operator():
        create_run(plane, ns, run_manifest(ns))
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting")
        patch_run_status(
            plane,
            ns,
            {
                "progress": {"step": 420, "evalPassRate": 0.52, "truncationRate": 0.031},
                "prediction": {"A": 0.61, "A_atLeast": 0.58, "C_mid": 2542.0},
            },
        )
        out = plane.kubectl("get", "srl", "-n", ns).splitlines()
    assert out[0].split() == [
        "NAME",
        "PHASE",
        "STEP",
        "PASSRATE",
        "A",
        "A>=",
        "C_MID",
        "CONFIDENCE",
        "GENS",
        "TRUNC",
        "AGE",
    ]
    shown = {c: cell(out[0], out[1], c) for c in ("PHASE", "STEP", "PASSRATE", "A", "A>=")}
    assert shown == {
        "PHASE": "Starting",
        "STEP": "420",
        "PASSRATE": "0.52",
        "A": "0.61",
        "A>=": "0.58",
    }
    assert (cell(out[0], out[1], "C_MID"), cell(out[0], out[1], "TRUNC")) == ("2542", "0.031")
    # No confidence yet: its cell is blank (the next cell, GENS, is the pods running: none).
    assert out[1][out[0].index("CONFIDENCE") : out[0].index("GENS")].strip() == ""


def test_the_operator_exports_each_runs_prediction_target_and_restarts(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    metrics = RunMetrics()

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"scalerl_{name}", {"namespace": ns, "run": "r1"})

    budget = {"targetPassRate": 0.7, "stopWhen": {"predictedABelow": 0.5, "minPoints": 8}}
    with operator(metrics=metrics):
        create_run(plane, ns, run_manifest(ns, budget=budget))
        wait_for(lambda: sample("gang_restarts") == 0, "the restarts gauge")
        assert (sample("target_pass_rate"), sample("stop_asymptote_below")) == (0.7, 0.5)
        assert sample("predicted_asymptote") is None  # no fit yet: no series, not a zero
        assert sample("sweep_variant_stopped") is None  # a run of no sweep
        fit = {"A": 0.61, "B": 1.4, "C_mid": 2542.0, "R0": 0.05, "points": 5}
        patch_run_status(plane, ns, {"prediction": {**fit, "predictedAtBudget": 0.58}})
        wait_for(lambda: sample("predicted_asymptote") == 0.61, "the prediction")
        assert (sample("predicted_cmid"), sample("predicted_slope")) == (2542.0, 1.4)
        assert sample("predicted_at_budget") == 0.58
        delete_run(plane, ns)
        wait_for(lambda: sample("gang_restarts") is None, "the run's series gone")


def test_same_named_runs_in_two_namespaces_keep_their_own_series(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    # r1 in `ns` and r1 in `other`: two runs, two sets of series; deleting one keeps the
    # other's (DESIGN.md, "Metrics": labels `namespace` and `run`).
    metrics = RunMetrics()
    other = plane.namespace(f"{ns}-b")

    def sample(name: str, namespace: str) -> float | None:
        labels = {"namespace": namespace, "run": "r1"}
        return metrics.registry.get_sample_value(f"scalerl_{name}", labels)

    with operator(metrics=metrics, namespaces=[ns, other]):
        create_run(plane, ns, run_manifest(ns, budget={"targetPassRate": 0.5}))
        create_run(plane, other, run_manifest(other, budget={"targetPassRate": 0.7}))
        wait_for(
            lambda: sample("gang_restarts", ns) == 0 == sample("gang_restarts", other),
            "both runs' restarts gauges",
        )
        assert (sample("target_pass_rate", ns), sample("target_pass_rate", other)) == (0.5, 0.7)
        delete_run(plane, other)
        wait_for(lambda: sample("gang_restarts", other) is None, f"{other}'s series gone")
        assert {name: sample(name, other) for name in RUN_GAUGES} == dict.fromkeys(RUN_GAUGES)
        assert (sample("gang_restarts", ns), sample("target_pass_rate", ns)) == (0, 0.5)
    refused = [
        e
        for e in requests(plane, 0.0)
        if e["user"]["username"] == OPERATOR_USER
        and in_namespace(e, other)
        and e["responseStatus"]["code"] == 403
    ]
    assert not refused, f"the chart's ClusterRole refused the operator in {other}: {refused}"


def test_the_pods_read_their_runs_namespace_from_the_config_map(
    plane: ControlPlane, ns: str, operator: Any
) -> None:
    # The processes label their series with the namespace of the spec the ConfigMap holds.
    with operator():
        create_run(plane, ns, run_manifest(ns))
        (config,) = wait_for(lambda: listed(plane, ns, "configmaps"), "the ConfigMap")
    (text,) = config["data"].values()
    assert parse_run(yaml.safe_load(text)).namespace == ns
