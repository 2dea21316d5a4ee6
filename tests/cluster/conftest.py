"""The real control plane (etcd, kube-apiserver, kube-controller-manager), once per session, and a
fresh namespace per test that enforces the `restricted` Pod Security level.

The binaries come from `make cluster-bins` (tests/cluster/bins.py), which `make test` runs first.
Where they are missing the tests skip with that command, except under CI, where they fail: CI
must build them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bins
import pytest
import yaml
from chart import OPERATOR_USER, install
from controlplane import ControlPlane, RunAccount
from runs import ensure_crd

from scalerl.operator import manifests


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    absent = bins.missing()
    if absent:
        message = f"control-plane binaries missing ({', '.join(absent)}): run make cluster-bins"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    started = ControlPlane.start(bins.bin_dir(), tmp_path_factory.mktemp("controlplane"))
    print(f"control plane up in {started.started_s:.1f} s at {started.url}")
    _PLANES.append(started)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def ns(plane: ControlPlane) -> Iterator[str]:
    """A new namespace for this test, `restricted` Pod Security enforced. Whatever the test made
    the operator do there, the server must have allowed it (its audit log says)."""
    first = len(plane.made)
    name = plane.namespace(f"t-{uuid.uuid4().hex[:8]}")
    yield name
    # Its runs (and those of any namespace it made besides) go with it: see clear_runs.
    plane.clear_runs(plane.made[first:])
    refused = [
        f"{e['verb']} {e['objectRef'].get('resource')}/{e['objectRef'].get('subresource', '')}"
        for e in plane.audit()
        if e["user"]["username"] == OPERATOR_USER
        and e.get("objectRef", {}).get("namespace") == name
        and e["responseStatus"]["code"] == 403
    ]
    assert not refused, f"the chart's ClusterRole refused the operator: {refused}"


_PLANES: list[ControlPlane] = []


@pytest.fixture(scope="module", autouse=True)
def module_leaves_no_runs() -> Iterator[None]:
    """The runs of namespaces a module's own fixtures made (not a test's `ns`) go with the
    module: a later operator for every namespace would adopt them (ControlPlane.clear_runs)."""
    before = [len(p.made) for p in _PLANES]
    yield
    for index, plane in enumerate(_PLANES):
        plane.clear_runs(plane.made[before[index] if index < len(before) else 0 :])


@pytest.fixture(scope="session")
def operator_kubeconfig(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`helm install` of the chart, once; a kubeconfig with its ServiceAccount's token."""
    return install(plane, tmp_path_factory.mktemp("chart"))


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[2]


@pytest.fixture
def as_run(
    plane: ControlPlane, ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> RunAccount:
    """`as_run(name, spec)`: create a run in `ns` (the CRD applied first) with the ServiceAccount,
    Role and RoleBinding the operator gives it, and point this process's KUBECONFIG at that
    ServiceAccount's token, as trainer 0 and the fit Job connect. Returns its user name."""

    def make(name: str, spec: dict[str, Any]) -> str:
        ensure_crd(plane)
        body = {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"path": "/m"}, "data": {"train": "/d.jsonl"}, **spec},
        }
        code, run = plane.api(
            "POST", f"/apis/scalerl.dev/v1alpha1/namespaces/{ns}/scalerlruns", body
        )
        assert code == 201, run
        owner = manifests.Owner(name, ns, run["metadata"]["uid"])
        for obj in (
            manifests.service_account(owner),
            manifests.role(owner),
            manifests.role_binding(owner),
        ):
            plane.kubectl("create", "-f", "-", input=yaml.safe_dump(obj))
        account = manifests.service_account(owner)["metadata"]["name"]
        config = json.loads(plane.kubeconfig.read_text())
        config["users"] = [{"name": "admin", "user": {"token": plane.token(ns, account)}}]
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        return f"system:serviceaccount:{ns}:{account}"

    return make
