"""Fixtures of the agents tests: the environment packages of environments/, installed as a user
installs theirs."""

from __future__ import annotations

import importlib
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "environments"


@pytest.fixture(scope="session")
def environment_packages() -> list[str]:
    """tool-arith and guess-number pip-installed into this venv (editable, offline, without
    their declared verifiers pin: README), so every process of a run imports them; their ids."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    before = set(purelib.glob("*.pth"))
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    command += ["--no-build-isolation"]
    for name in ("tool_arith", "guess_number"):
        command += ["-e", str(ENVIRONMENTS / name)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    # An editable install is a .pth file, which Python reads only at start-up: processes a run
    # starts see the packages, but this one must read the new .pth files itself (on a fresh
    # machine, CI's, nothing was installed when pytest started).
    for pth in sorted(set(purelib.glob("*.pth")) - before):
        site.addpackage(str(purelib), pth.name, None)
    importlib.invalidate_caches()
    return ["tool-arith", "guess-number"]
