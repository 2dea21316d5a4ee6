"""The test kubelet: its translation of the operator's pods (kubelet_plan.py) and its processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import NS, job_pod, pods, run_manifest
from kubelet import Kubelet
from kubelet_plan import (
    SCALERL_PORTS,
    Cluster,
    Network,
    NotReady,
    contract_port_variables,
    plan_pod,
    rewrite_paths,
)

from scalerl.operator import manifests, names
from scalerl.operator.manifests import Images, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import parse_run

WAIT = 30.0
URL = "http://127.0.0.1:1"


def served_secret(secret: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Secret as the API server stores it: stringData base64-encoded into data."""
    if secret is None:
        return None
    data = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
    return {**secret, "data": data}


def gang(tmp_path: Path, **spec: Any) -> tuple[dict[str, Any], Cluster]:
    """The pods of r1's gang as the Job controller makes them, and the cluster around them."""
    body = run_manifest(**{"generators": {"gpus": 0}, "trainers": {"gpus": 0}, **spec})
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
        api_url=URL,
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


# --- processes -----------------------------------------------------------------------------------


def pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "command": ["python", "-c", script],
        "env": [
            {"name": "GREETING", "value": "hello"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {names.LABEL_RUN: "t"}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def phase(k8s: Any, name: str) -> str | None:
    found = k8s.get("pods", name)
    return ((found or {}).get("status") or {}).get("phase")


def test_a_pod_runs_with_its_environment_and_ends_with_its_exit_code(k8s: Any) -> None:
    script = "import os, sys; print(os.environ['GREETING'], os.environ['POD_NAME']); sys.exit(3)"
    with Kubelet(k8s) as kubelet:
        k8s.create(pod("p1", script))
        k8s.wait_for(lambda: phase(k8s, "p1") == "Failed", WAIT, "p1 failed")
        assert "hello p1" in kubelet.log("p1")
    state = k8s.get("pods", "p1")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3 and state["terminated"]["reason"] == "Error"


def test_a_killed_process_fails_its_pod_with_128_plus_the_signal(k8s: Any) -> None:
    with Kubelet(k8s) as kubelet:
        k8s.create(pod("p2", "import time; time.sleep(60)"))
        k8s.wait_for(lambda: phase(k8s, "p2") == "Running", WAIT, "p2 running")
        os.kill(kubelet.pid("p2"), signal.SIGKILL)
        k8s.wait_for(lambda: phase(k8s, "p2") == "Failed", WAIT, "p2 failed")
        assert kubelet.ended["p2"] == 137


def test_deleting_a_pod_kills_its_whole_process_group(k8s: Any, tmp_path: Path) -> None:
    # The pod's process starts a child that ignores SIGTERM: the grace period ends it.
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    script = (
        "import subprocess, sys, time, json; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        f"open({str(tmp_path / 'child')!r}, 'w').write(json.dumps(p.pid)); time.sleep(60)"
    )
    with Kubelet(k8s, max_grace_s=1.0) as kubelet:
        k8s.create(pod("p3", script))
        k8s.wait_for(lambda: (tmp_path / "child").exists(), WAIT, "the child started")
        assert len(kubelet.leftovers()) == 2
        k8s.delete("pods", "p3")
        k8s.wait_for(lambda: "p3" in kubelet.ended, WAIT, "p3's main process reaped")
        assert kubelet.ended["p3"] == 128 + signal.SIGTERM
        k8s.wait_for(lambda: not kubelet.leftovers(), WAIT, "p3's child gone after the grace")


def test_a_pod_waits_for_its_claim_and_a_gpu_pod_never_starts(k8s: Any) -> None:
    volume = {"name": "v", "persistentVolumeClaim": {"claimName": "store"}}
    mount = {"volumeMounts": [{"name": "v", "mountPath": "/data"}]}
    script = "import os; print(sorted(os.listdir('/data')))"
    gpu = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    with Kubelet(k8s) as kubelet:
        (kubelet.claim_dir(NS, "store") / "x.txt").write_text("x")
        k8s.create(pod("p4", script, volumes=[volume], container=mount))
        k8s.create(pod("p5", "pass", container=gpu))
        waiting = k8s.wait_for(lambda: k8s.get("pods", "p4")["status"].get("conditions"), WAIT)
        assert waiting[0]["message"] == 'persistentvolumeclaim "store" not found'

        k8s.create(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "store"}}
        )
        k8s.wait_for(lambda: phase(k8s, "p4") == "Succeeded", WAIT, "p4 ran once its claim exists")
        assert "['x.txt']" in kubelet.log("p4")  # /data in args became the claim's directory
        time.sleep(0.5)
        assert phase(k8s, "p5") == "Pending"
        assert "Insufficient nvidia.com/gpu" in json.dumps(k8s.get("pods", "p5")["status"])
    assert len(pods(k8s, "t")) == 2


def test_at_exit_the_kubelet_stops_processes_with_sigterm_first(k8s: Any, tmp_path: Path) -> None:
    done = tmp_path / "stopped"
    script = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        f"    open({str(done)!r}, 'w').write('SIGTERM'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    with Kubelet(k8s) as kubelet:
        k8s.create(pod("p6", script))
        k8s.wait_for(lambda: "up" in kubelet.log("p6"), WAIT, "p6 up")
    assert done.read_text() == "SIGTERM"
    assert not kubelet.leftovers()
