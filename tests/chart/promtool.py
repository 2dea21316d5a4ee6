"""Debian's promtool, as the chart tests call it (the `promtool` fixture finds the binary)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def promtool_run(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *map(str, args)], capture_output=True, text=True, timeout=30
    )


def output(done: subprocess.CompletedProcess[str]) -> str:
    """promtool's answer, for an assertion message."""
    return f"promtool exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
