"""Pods that run in the operator's image, built for real with Podman from this checkout
(containers.py): the test kubelet runs them with `podman run`, as the pod's securityContext says,
and keeps their status, logs, exit codes and deletion as it does for local processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

import containers
import pytest
from controlplane import ControlPlane
from kubelet import Kubelet
from test_kubelet import create, get_pod, phase, wait_for

from scalerl.operator.manifests import Images

IMAGE = Images().fit  # scalerl/operator:VERSION, as the operator's pods name it
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


@pytest.fixture(scope="module")
def image() -> str:
    return containers.operator_image()


def pod(name: str, script: str) -> dict[str, Any]:
    """A pod of the operator's image, as the chart's operator pod is made: read-only root, UID
    10001, an emptyDir on /tmp."""
    container = {
        "name": "main",
        "image": IMAGE,
        "command": ["python", "-c", script],
        "env": [{"name": "GREETING", "value": "hello"}],
        "securityContext": CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": RESTRICTED,
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


# What the container sees of itself: who it runs as, its hostname, its environment, which of its
# paths are writable, and the API server as its ServiceAccount.
PROBE = """
import json, os, socket, sys
from scalerl.kube import Kube
def writable(path):
    try:
        open(os.path.join(path, "probe"), "w").close()
        return True
    except OSError:
        return False
try:
    Kube.connect().request("GET", "/api/v1/namespaces/{ns}/pods")
    api = "allowed"
except Exception as err:
    api = str(err)
print(json.dumps({{
    "uid": os.getuid(), "gid": os.getgid(), "hostname": socket.gethostname(),
    "greeting": os.environ.get("GREETING"), "scalerl": sys.executable,
    "tmp": writable("/tmp"), "root": writable("/"), "opt": writable("/opt"), "api": api,
}}), flush=True)
sys.exit(3)
"""


def test_a_pod_of_the_image_runs_in_it_as_its_securitycontext_says(
    plane: ControlPlane, ns: str, image: str
) -> None:
    with Kubelet(plane, ns, images={IMAGE: image}) as kubelet:
        create(plane, ns, pod("c1", PROBE.format(ns=ns)))
        wait_for(lambda: phase(plane, ns, "c1") == "Failed", "c1 ended", timeout_s=120)
        seen = json.loads(kubelet.log("c1").strip().splitlines()[-1])
        assert kubelet.in_image("c1") == image
    assert (seen["uid"], seen["gid"]) == (10001, 10001)
    assert seen["hostname"] == "c1" and seen["greeting"] == "hello"
    assert seen["scalerl"].startswith("/opt/scalerl/")  # the image's venv, not this machine's
    # Only the pod's emptyDir is writable: the root filesystem is read-only.
    assert seen["tmp"] and not seen["root"] and not seen["opt"]
    # The token is the pod's ServiceAccount's; the default account may not list pods.
    assert f"system:serviceaccount:{ns}:default" in seen["api"] and "forbidden" in seen["api"]
    found = get_pod(plane, ns, "c1")
    assert found is not None
    assert found["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_a_killed_container_fails_with_137_and_a_deleted_one_gets_sigterm(
    plane: ControlPlane, ns: str, image: str
) -> None:
    # The container's main process is its PID 1, which the kernel spares the signals it does not
    # handle (in a cluster too): it stops on SIGTERM because it says so.
    sleeper = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    print('SIGTERM', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('up', flush=True); time.sleep(120)\n"
    )
    with Kubelet(plane, ns, images={IMAGE: image}, max_grace_s=5.0) as kubelet:
        create(plane, ns, pod("c2", sleeper))
        create(plane, ns, pod("c3", sleeper))
        for name in ("c2", "c3"):
            wait_for(lambda n=name: "up" in kubelet.log(n), f"{name} up", timeout_s=120)
        assert len(kubelet.leftovers()) >= 2  # the containers' processes carry the marker
        os.kill(kubelet.pid("c2"), signal.SIGKILL)  # the container's own main process
        wait_for(lambda: phase(plane, ns, "c2") == "Failed", "c2 failed")
        assert kubelet.ended["c2"] == 137
        plane.kubectl("delete", "pod", "c3", "-n", ns, "--wait=false")
        wait_for(lambda: get_pod(plane, ns, "c3") is None, "c3 removed by the kubelet")
        assert kubelet.ended["c3"] == 0 and "SIGTERM" in kubelet.log("c3")
    names = subprocess.run(
        ["podman", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True
    ).stdout.split()
    assert not [n for n in names if n.endswith(("-c2", "-c3")) or "-c2-" in n or "-c3-" in n]


def test_a_deployments_pod_is_restarted_in_place_with_its_emptydir(
    plane: ControlPlane, ns: str, image: str
) -> None:
    """restartPolicy Always (the chart's operator): the container ends, the kubelet starts it
    again in the same pod; what it wrote to its emptyDir is still there."""
    script = (
        "import os, sys, time\n"
        "runs = open('/tmp/runs', 'a+'); runs.write('x'); runs.flush(); runs.seek(0)\n"
        "print('run', len(runs.read()), flush=True)\n"
        "sys.exit(1) if os.path.getsize('/tmp/runs') == 1 else time.sleep(120)\n"
    )
    always = pod("c4", script)
    always["spec"]["restartPolicy"] = "Always"

    def restarts() -> int:
        statuses = ((get_pod(plane, ns, "c4") or {}).get("status") or {}).get("containerStatuses")
        return int(statuses[0]["restartCount"]) if statuses else 0

    with Kubelet(plane, ns, images={IMAGE: image}, max_grace_s=2.0) as kubelet:
        create(plane, ns, always)
        wait_for(lambda: "run 2" in kubelet.log("c4"), "c4 started twice", timeout_s=120)
        assert kubelet.ended["c4"] == 1 and "run 1" in kubelet.log("c4")
        wait_for(lambda: restarts() == 1, "restartCount 1")
        assert phase(plane, ns, "c4") == "Running"
        plane.kubectl("delete", "pod", "c4", "-n", ns, "--wait=false")
        wait_for(lambda: get_pod(plane, ns, "c4") is None, "c4 removed by the kubelet")


@pytest.mark.slow
def test_make_images_builds_the_operator_image_with_podman(image: str) -> None:
    """`make images` for real on the local base `make base-image` made (the fixture built the
    same sources: Podman's layer cache makes this quick). The image runs `scalerl`."""
    environ = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    done = subprocess.run(
        ["make", "images", f"BASE={containers.BASE_IMAGE}", "IMAGES=operator"],
        cwd=containers.ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=containers.BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    version = IMAGE.rpartition(":")[2]
    shown = subprocess.run(
        ["podman", "run", "--rm", *containers.limits(), f"scalerl/operator:{version}", "fit", "-h"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--run" in shown.stdout
