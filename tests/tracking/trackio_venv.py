"""A venv holding trackio, beside the project's: trackio pins pillow below 13, this project's venv
has pillow 13, so trackio cannot be installed there (trackio-requirements.txt says why).

Built by `make trackio-venv` (which `make test` runs first: the tests themselves download nothing)
from trackio-requirements.txt's exact pins (tests/pinned_venv.py: cached under ~/.cache/scalerl/,
rebuilt when a pin changes). Cold, without pip's cache,
it took 24 s here (downloads included) and holds 200 MB.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, run as a script too

import pinned_venv  # noqa: E402

REQUIREMENTS = Path(__file__).with_name("trackio-requirements.txt")


def trackio_python() -> Path:
    """Where the interpreter of the cached trackio venv is (or goes)."""
    return pinned_venv.venv_path("trackio", REQUIREMENTS) / "bin" / "python"


def build() -> Path:
    """The trackio venv's interpreter, the venv built first when missing."""
    return pinned_venv.build("trackio", REQUIREMENTS) / "bin" / "python"


if __name__ == "__main__":
    print(build())
