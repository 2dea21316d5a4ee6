"""Packages of environments/ pip-installed into the test venv (editable, offline, without their
declared dependencies), as a user installs theirs, and importable by this process too."""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ENVIRONMENTS = Path(__file__).resolve().parents[1] / "environments"


def install_editable(*names: str) -> None:
    """pip install -e environments/<name> for each of `names` (folder and module names alike).

    Every pytest-xdist worker installs what its tests need: one pip at a time writes the venv
    (two at once race on the same .pth and metadata files). An editable install is a .pth file,
    which Python reads only at start-up: the processes a run starts see the packages, but this
    one reads the .pth of each it cannot import yet (on a fresh machine, CI's, nothing was
    installed when pytest started)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    command += ["--no-build-isolation"]
    for name in names:
        command += ["-e", str(ENVIRONMENTS / name)]
    with open(purelib / ".scalerl-tests-pip.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(command, check=True, capture_output=True, timeout=300)
    for name in names:
        if importlib.util.find_spec(name) is None:
            for pth in purelib.glob(f"__editable__.{name}-*.pth"):
                site.addpackage(str(purelib), pth.name, None)
    importlib.invalidate_caches()
