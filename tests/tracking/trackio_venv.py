"""A venv holding trackio, beside the project's: trackio pins pillow below 13, this project's venv
has pillow 13, so trackio cannot be installed there (trackio-requirements.txt says why).

Built by `make trackio-venv` (which `make test` runs first: the tests themselves download nothing)
from trackio-requirements.txt's exact pins with the interpreter this venv was made
from, cached under ~/.cache/scalerl/ by the hash of that file and the Python version; a changed
pin builds a new one. It is made in a temporary folder and renamed into place, so a build that
fails (or two at once) never leaves a half-made venv for the next run. Cold, without pip's cache,
it took 24 s here (downloads included) and holds 200 MB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("trackio-requirements.txt")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalerl"


def trackio_python() -> Path:
    """Where the interpreter of the cached trackio venv is (or goes)."""
    pins = REQUIREMENTS.read_bytes()
    key = hashlib.sha256(pins + sys.version.encode()).hexdigest()[:16]
    return CACHE / f"trackio-{key}" / "bin" / "python"


def build() -> Path:
    """The trackio venv's interpreter, the venv built first when missing."""
    python = trackio_python()
    venv = python.parent.parent
    if python.exists():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="trackio-building-", dir=CACHE))
    try:
        _run([sys._base_executable, "-m", "venv", str(building)])  # type: ignore[attr-defined]
        pip = [str(building / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--quiet", "--no-deps", "-r", str(REQUIREMENTS)])
        _run([*pip, "check"])  # the pins hold everything trackio needs
        # The venv's scripts name their interpreter by path: rename, do not copy.
        building.rename(venv)
    except FileExistsError:  # another session built it meanwhile
        pass
    except OSError as err:
        if not python.exists():
            raise AssertionError(f"could not put the trackio venv at {venv}: {err}") from err
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return python


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(
            f"building the trackio venv: {' '.join(command)} failed "
            f"({done.returncode}):\n{done.stdout}{done.stderr}"
        )


if __name__ == "__main__":
    print(build())
