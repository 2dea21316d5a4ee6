"""A run with an OpenEnv server's image (spec.environment.openenv.image) on the real control
plane: the operator, as the chart's ServiceAccount, makes the server's Deployment and Service,
owned by the run; the Deployment controller makes its pods, which the namespace's restricted Pod
Security admits; the generators are told the Service's URL; suspending the run takes the server's
pods away and resuming brings them back; deleting the run removes it all. No kubelet runs the
image: creation and removal are what is checked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from chart import in_thread
from controlplane import ControlPlane
from runs import (
    create_run,
    delete_run,
    ensure_crd,
    gang_up,
    get_run,
    listed,
    owned,
    patch_run,
    phase_is,
    pods,
    requests,
    wait_for,
)
from small_run import run_manifest
from test_rbac import ON_OPENENV, used

from scalerl.environment import OPENENV_URL_VAR

SERVER = {"image": "registry.example/calculator:1", "port": 8123, "replicas": 2}


@pytest.fixture(scope="module")
def kubeconfig(plane: ControlPlane, operator_kubeconfig: Path) -> Path:
    ensure_crd(plane)
    return operator_kubeconfig


def generator_environ(plane: ControlPlane, ns: str) -> dict[str, str]:
    (job,) = [j for j in listed(plane, ns, "jobs") if j["metadata"]["name"] == "r1-generator"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_operator_runs_the_server_with_the_run_and_removes_it_with_the_run(
    plane: ControlPlane, ns: str, kubeconfig: Path
) -> None:
    since = time.time()
    with in_thread(plane, kubeconfig, [ns]):
        run = create_run(plane, ns, run_manifest(ns, environment={"openenv": SERVER}))
        wait_for(
            lambda: (
                owned(plane, ns).get("deployments") == ["r1-env"]
                and "r1-env" in owned(plane, ns).get("services", [])
            ),
            "the server's Deployment and Service",
        )
        gang_up(plane, ns, 0)
        wait_for(lambda: len(pods(plane, ns, role="env")) == 2, "the server's two pods")
        # Suspended, the run keeps no server pod (the Service stays); resumed, it has them again.
        patch_run(plane, ns, {"suspend": True})
        wait_for(lambda: phase_is(plane, ns, "Suspended"), "Suspended")
        wait_for(
            lambda: "deployments" not in owned(plane, ns) and not pods(plane, ns, role="env"),
            "no server while suspended",
        )
        assert "r1-env" in owned(plane, ns)["services"]
        patch_run(plane, ns, {"suspend": False})
        gang_up(plane, ns, 0)
        wait_for(lambda: owned(plane, ns).get("deployments") == ["r1-env"], "the server again")
        # The server follows its spec: three replicas now.
        patch_run(plane, ns, {"environment": {"openenv": {**SERVER, "replicas": 3}}})
        wait_for(lambda: len(pods(plane, ns, role="env")) == 3, "the server's third pod")
    uid = run["metadata"]["uid"]
    for resource in ("deployments", "services"):
        (server,) = [o for o in listed(plane, ns, resource) if o["metadata"]["name"] == "r1-env"]
        assert [r["uid"] for r in server["metadata"]["ownerReferences"]] == [uid]
    (service,) = [o for o in listed(plane, ns, "services") if o["metadata"]["name"] == "r1-env"]
    assert service["spec"]["ports"][0]["port"] == 8123
    # The Deployment controller made its pods, admitted by restricted Pod Security.
    servers = wait_for(
        lambda: len(pods(plane, ns, role="env")) == 3 and pods(plane, ns, role="env"),
        "the server's three pods",
    )
    assert {p["spec"]["containers"][0]["image"] for p in servers} == {SERVER["image"]}
    assert generator_environ(plane, ns)[OPENENV_URL_VAR] == f"http://r1-env.{ns}.svc:8123"
    before = owned(plane, ns)

    restarted = time.time()
    with in_thread(plane, kubeconfig, [ns]):
        # The restarted operator finds the server where it is (a get), and makes no other.
        wait_for(
            lambda: ("apps", "deployments", "get") in used(requests(plane, restarted)),
            "the restarted operator looking for the server",
        )
        assert owned(plane, ns)["deployments"] == before["deployments"] == ["r1-env"]
        delete_run(plane, ns)
        wait_for(lambda: owned(plane, ns) == {}, "no children, the server's included")
    assert get_run(plane, ns) is None
    assert ON_OPENENV <= used(requests(plane, since)), "the server's permissions, as granted"
