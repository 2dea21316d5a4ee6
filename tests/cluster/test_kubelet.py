"""The test kubelet: its translation of the operator's pods (kubelet_plan.py), and its processes
as the real API server sees them (bound, Running, ended with their exit codes, deleted gracefully).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import NODE, ControlPlane
from kubelet import Kubelet
from kubelet_plan import (
    SCALERL_PORTS,
    Cluster,
    Credentials,
    Network,
    NotReady,
    contract_port_variables,
    plan_pod,
    rewrite_paths,
)
from small_run import run_manifest

from scalerl.operator import manifests, names
from scalerl.operator.manifests import Images, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import parse_run

WAIT = 30.0
URL = "https://127.0.0.1:1"
NS = "team-a"


def job_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """The pod an Indexed Job's controller makes for `index` (what the real one is seen to make:
    the index as label, annotation and JOB_COMPLETION_INDEX through the downward API)."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = job["metadata"]
    labels = {
        **template["metadata"].get("labels", {}),
        names.LABEL_JOB_INDEX: str(index),
        "batch.kubernetes.io/job-name": meta["name"],
    }
    spec = template["spec"]
    spec["hostname"] = f"{meta['name']}-{index}"
    index_field = f"metadata.annotations['{names.LABEL_JOB_INDEX}']"
    for container in spec["containers"]:
        container.setdefault("env", []).append(
            {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_field}}}
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{index}-abcde",
            "namespace": NS,
            "labels": labels,
            "annotations": {names.LABEL_JOB_INDEX: str(index)},
        },
        "spec": spec,
    }


def served_secret(secret: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Secret as the API server stores it: stringData base64-encoded into data."""
    if secret is None:
        return None
    data = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
    return {**secret, "data": data}


def gang(tmp_path: Path, **spec: Any) -> tuple[dict[str, Any], Cluster]:
    """The pods of r1's gang as the Job controller makes them, and the cluster around them."""
    cpu = {"generators": {"gpus": 0}, "trainers": {"gpus": 0}}
    body = run_manifest(NS, **{**cpu, **spec})
    run, owner = parse_run(body), Owner("r1", NS, "uid-1")
    objects = manifests.children(run, owner, 0, Images(), StreamKeys.generate())
    for obj in objects:
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    found = {
        role: job_pod(by_kind[("Job", names.workload("r1", role))], 0)
        for role in names.WORKLOAD_ROLES
    }
    for pod in found.values():
        pod["metadata"]["uid"] = pod["metadata"]["name"]
    cluster = Cluster(
        services=[o for o in objects if o["kind"] == "Service"],
        config_maps=lambda _ns, name: by_kind.get(("ConfigMap", name)),
        secrets=lambda _ns, name: served_secret(by_kind.get(("Secret", name))),
        claim_dir=lambda _ns, claim: tmp_path / "pv" / claim,
        credentials=Credentials(URL, tmp_path / "ca.crt", lambda _pod: "a-token"),
    )
    return found, cluster


def plans(tmp_path: Path, **spec: Any) -> dict[str, Any]:
    found, cluster = gang(tmp_path, **spec)
    network = Network()
    return {
        role: plan_pod(pod, cluster, network, tmp_path / role, {"PATH": "/bin"})
        for role, pod in found.items()
    }


def test_trainer_and_generators_agree_on_the_trainers_local_address(tmp_path: Path) -> None:
    trainer, generator = (p.env for p in plans(tmp_path).values())
    for variable in ("SCALERL_CHANNEL_PORT", "SCALERL_SYNC_PORT"):
        assert trainer[variable] == generator[variable]
        assert int(trainer[variable]) not in (manifests.CHANNEL_PORT, manifests.SYNC_PORT)
    assert trainer["SCALERL_TRAINER_HOST"] == generator["SCALERL_TRAINER_HOST"] == "127.0.0.1"
    assert trainer["SCALERL_METRICS_PORT"] != generator["SCALERL_METRICS_PORT"]


def test_trainer_0_serves_the_ports_the_generators_dial(tmp_path: Path) -> None:
    trainer, generator = plans(tmp_path).values()
    dialled = {int(generator.env[v]) for v in ("SCALERL_CHANNEL_PORT", "SCALERL_SYNC_PORT")}
    assert dialled <= trainer.listens
    assert not dialled & generator.listens
    assert int(generator.env["SCALERL_METRICS_PORT"]) in generator.listens


def test_mount_paths_become_the_claims_and_the_config_maps_directories(tmp_path: Path) -> None:
    trainer = plans(tmp_path)["trainer"]
    run_dir = tmp_path / "pv" / "ckpt" / "runs" / "r1"
    assert trainer.env["SCALERL_RUN_DIR"] == str(run_dir)
    spec_file = Path(trainer.env["SCALERL_SPEC"])
    spec = yaml.safe_load(trainer.files[spec_file])["spec"]
    assert spec["model"]["path"] == str(tmp_path / "pv" / "ckpt" / "models" / "base")
    assert spec["data"]["train"] == str(tmp_path / "pv" / "ckpt" / "data" / "train.jsonl")
    assert run_dir in trainer.dirs


def test_downward_api_and_credentials(tmp_path: Path) -> None:
    trainer, generator = plans(tmp_path).values()
    assert trainer.env["JOB_COMPLETION_INDEX"] == generator.env["JOB_COMPLETION_INDEX"] == "0"
    assert "KUBECONFIG" not in generator.env  # automountServiceAccountToken: false
    config = yaml.safe_load(trainer.files[Path(trainer.env["KUBECONFIG"])])
    assert config["clusters"][0]["cluster"]["server"] == URL
    assert config["users"][0]["user"]["token"] == "a-token"
    assert config["contexts"][0]["context"]["namespace"] == NS


def test_the_kubelet_knows_every_port_of_the_environment_contract() -> None:
    assert contract_port_variables() == set(SCALERL_PORTS)


def test_a_pod_asking_for_a_gpu_is_unschedulable_here(tmp_path: Path) -> None:
    found, cluster = gang(tmp_path, generators={"gpus": 1})
    with pytest.raises(NotReady, match="Insufficient nvidia.com/gpu"):
        plan_pod(found["generator"], cluster, Network(), tmp_path, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/data/x.jsonl", "/L/data/x.jsonl"),
        ("path: /data", "path: /L/data"),
        ("/database/x", "/database/x"),
        ("/srv/data/x", "/srv/data/x"),
        ("/models/a,/data/b", "/L/models/a,/L/data/b"),
    ],
)
def test_rewrite_paths(text: str, expected: str) -> None:
    mounts = [("/models", Path("/L/models")), ("/data", Path("/L/data"))]
    assert rewrite_paths(text, mounts) == expected


# --- processes, on the real API server -----------------------------------------------------------

# What Pod Security `restricted` asks of every container.
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", script],
        "env": [
            {"name": "GREETING", "value": "hello"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "securityContext": RESTRICTED,
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {names.LABEL_RUN: "t"}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def create(plane: ControlPlane, ns: str, obj: dict[str, Any]) -> None:
    plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj))


def get_pod(plane: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    code, body = plane.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return dict(body) if code == 200 else None


def phase(plane: ControlPlane, ns: str, name: str) -> str | None:
    return ((get_pod(plane, ns, name) or {}).get("status") or {}).get("phase")


def wait_for(what: Any, message: str, timeout_s: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := what()):
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {message}"
        time.sleep(0.1)
    return value


def test_a_pod_is_bound_runs_with_its_environment_and_ends_with_its_exit_code(
    plane: ControlPlane, ns: str
) -> None:
    script = "import os, sys; print(os.environ['GREETING'], os.environ['POD_NAME']); sys.exit(3)"
    with Kubelet(plane, ns) as kubelet:
        create(plane, ns, pod("p1", script))
        wait_for(lambda: phase(plane, ns, "p1") == "Failed", "p1 failed")
        assert "hello p1" in kubelet.log("p1")
    found = get_pod(plane, ns, "p1")
    assert found is not None and found["spec"]["nodeName"] == NODE
    state = found["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3 and state["terminated"]["reason"] == "Error"


def test_a_pods_process_calls_the_api_as_its_service_account(plane: ControlPlane, ns: str) -> None:
    # The token is the TokenRequest API's, bound to the pod: the server knows whose it is.
    script = (
        "from scalerl.kube import Kube; import sys; "
        f"Kube.connect().request('GET', '/api/v1/namespaces/{ns}/pods'); sys.exit(0)"
    )
    with Kubelet(plane, ns) as kubelet:
        create(plane, ns, pod("p0", script))
        wait_for(lambda: phase(plane, ns, "p0") in ("Succeeded", "Failed"), "p0 ended")
        said = kubelet.log("p0")
    # The namespace's default ServiceAccount may not list pods: the server's 403 names it.
    assert f"system:serviceaccount:{ns}:default" in said and "forbidden" in said, said
    assert phase(plane, ns, "p0") == "Failed"


def test_a_killed_process_fails_its_pod_with_128_plus_the_signal(
    plane: ControlPlane, ns: str
) -> None:
    with Kubelet(plane, ns) as kubelet:
        create(plane, ns, pod("p2", "import time; time.sleep(60)"))
        wait_for(lambda: phase(plane, ns, "p2") == "Running", "p2 running")
        os.kill(kubelet.pid("p2"), signal.SIGKILL)
        wait_for(lambda: phase(plane, ns, "p2") == "Failed", "p2 failed")
        assert kubelet.ended["p2"] == 137


def test_a_deleted_pod_is_stopped_gracefully_then_removed(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    # The pod's process starts a child that ignores SIGTERM: the grace period ends it. The
    # server keeps the pod (Terminating) until the kubelet says it is gone.
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    script = (
        "import subprocess, sys, time, json; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        f"open({str(tmp_path / 'child')!r}, 'w').write(json.dumps(p.pid)); time.sleep(60)"
    )
    with Kubelet(plane, ns, max_grace_s=1.0) as kubelet:
        create(plane, ns, pod("p3", script))
        wait_for(lambda: (tmp_path / "child").exists(), "the child started")
        assert len(kubelet.leftovers()) == 2
        plane.kubectl("delete", "pod", "p3", "-n", ns, "--wait=false")
        wait_for(lambda: get_pod(plane, ns, "p3") is None, "p3 removed by the kubelet")
        assert kubelet.ended["p3"] == 128 + signal.SIGTERM
        wait_for(lambda: not kubelet.leftovers(), "p3's child gone after the grace")


def test_a_pod_waits_for_its_claim_and_a_gpu_pod_is_never_bound(
    plane: ControlPlane, ns: str
) -> None:
    volume = {"name": "v", "persistentVolumeClaim": {"claimName": "store"}}
    mount = {"volumeMounts": [{"name": "v", "mountPath": "/data"}]}
    script = "import os; print(sorted(os.listdir('/data')))"
    gpu = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "store"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    with Kubelet(plane, ns) as kubelet:
        (kubelet.claim_dir("store") / "x.txt").write_text("x")
        create(plane, ns, pod("p4", script, volumes=[volume], container=mount))
        create(plane, ns, pod("p5", "pass", container=gpu))
        waiting = wait_for(
            lambda: (get_pod(plane, ns, "p4") or {}).get("status", {}).get("conditions"),
            "p4 says why it waits",
        )
        assert waiting[0]["message"] == 'persistentvolumeclaim "store" not found'
        create(plane, ns, claim)
        wait_for(lambda: phase(plane, ns, "p4") == "Succeeded", "p4 ran once its claim exists")
        assert "['x.txt']" in kubelet.log("p4")  # /data in args became the claim's directory
        said = wait_for(lambda: json.dumps(get_pod(plane, ns, "p5")), "p5")
        assert "Insufficient nvidia.com/gpu" in said
    p5 = get_pod(plane, ns, "p5")
    assert p5 is not None and "nodeName" not in p5["spec"] and p5["status"]["phase"] == "Pending"


def test_at_exit_the_kubelet_stops_processes_with_sigterm_first(
    plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    done = tmp_path / "stopped"
    script = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        f"    open({str(done)!r}, 'w').write('SIGTERM'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    with Kubelet(plane, ns) as kubelet:
        create(plane, ns, pod("p6", script))
        wait_for(lambda: "up" in kubelet.log("p6"), "p6 up")
    assert done.read_text() == "SIGTERM"
    assert not kubelet.leftovers()
