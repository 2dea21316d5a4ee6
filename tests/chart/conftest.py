"""Fixtures of the chart tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus's rule checker and unit-test runner (Debian's package `prometheus`).

    CI installs it, so there a missing promtool is a failure; on a workstation it is a skip.
    """
    found = shutil.which("promtool")
    if found is None:
        install = "apt-get install -y --no-install-recommends prometheus"
        if os.environ.get("CI"):
            pytest.fail(f"promtool not installed in CI: {install}")
        pytest.skip("promtool not installed: apt-get install prometheus")
    return Path(found)
