"""The real control plane (etcd, kube-apiserver, kube-controller-manager), once per session, and a
fresh namespace per test that enforces the `restricted` Pod Security level.

The binaries come from `make cluster-bins` (tests/cluster/bins.py), which `make test` runs first.
Where they are missing the tests skip with that command, except under CI, where they fail: CI
must build them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import bins
import pytest
from controlplane import ControlPlane


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
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def ns(plane: ControlPlane) -> str:
    """A new namespace for this test, `restricted` Pod Security enforced."""
    return plane.namespace(f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def repo() -> Path:
    return Path(__file__).resolve().parents[2]
