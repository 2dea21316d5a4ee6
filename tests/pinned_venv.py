"""A venv of its own for a tool whose pins clash with the project's (trackio, checkov), built from
a requirements file's exact pins with the interpreter this venv was made from and cached under
~/.cache/scalerl/ by the hash of that file and the Python version: a changed pin builds a new one.
It is made in a temporary folder and renamed into place (a venv's scripts name their interpreter
by path: rename, do not copy), so a build that fails, or two at once, never leaves a half-made
venv for the next run."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalerl"


def venv_path(name: str, requirements: Path) -> Path:
    """Where the venv `name` of these pins is (or goes)."""
    key = hashlib.sha256(requirements.read_bytes() + sys.version.encode()).hexdigest()[:16]
    return CACHE / f"{name}-{key}"


def build(name: str, requirements: Path) -> Path:
    """The venv `name` of `requirements`' pins, built first when missing."""
    venv = venv_path(name, requirements)
    if (venv / "bin" / "python").exists():
        return venv
    CACHE.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{name}-building-", dir=CACHE))
    try:
        _run(name, [sys._base_executable, "-m", "venv", str(building)])  # type: ignore[attr-defined]
        pip = [str(building / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        _run(name, [*pip, "install", "--quiet", "--no-deps", "-r", str(requirements)])
        _run(name, [*pip, "check"])  # the pins hold everything the tool needs
        building.rename(venv)
    except OSError as err:  # another session built it meanwhile, or the cache is unwritable
        if not (venv / "bin" / "python").exists():
            raise RuntimeError(f"could not put the {name} venv at {venv}: {err}") from err
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return venv


def _run(name: str, command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"building the {name} venv: {' '.join(command)} failed ({done.returncode}):\n"
            f"{done.stdout}{done.stderr}"
        )
