"""Fixtures of the agents tests: the environment packages of environments/, installed as a user
installs theirs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "environments"


@pytest.fixture(scope="session")
def environment_packages() -> list[str]:
    """tool-arith and guess-number pip-installed into this venv (editable, offline, without
    their declared verifiers pin: README), so every process of a run imports them; their ids."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    command += ["--no-build-isolation"]
    for name in ("tool_arith", "guess_number"):
        command += ["-e", str(ENVIRONMENTS / name)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    importlib.invalidate_caches()
    return ["tool-arith", "guess-number"]
