"""A command run as a container's first process (a fit Job's `scalerl fit`) still stops on
SIGTERM: the kernel ignores, for a PID namespace's first process, any signal it has no handler
for, so without one a pod's deletion waits out its whole grace period."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A command that waits, added to the CLI, run by scalerl.cli.main as `scalerl wait`.
WAITER = """
import sys, time
from scalerl import cli

def add(subparsers):
    p = subparsers.add_parser("wait")
    p.set_defaults(handler=lambda args: (print("waiting", flush=True), time.sleep(60), 0)[2])

cli.COMMANDS = (*cli.COMMANDS, add)
sys.exit(cli.main(["wait"]))
"""


def test_a_command_that_is_its_namespaces_first_process_stops_on_sigterm() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is not installed")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", WAITER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
        (inner,) = _children(proc.pid)  # pid 1 of the new namespace, as this one sees it
        started = time.monotonic()
        subprocess.run(["kill", "-TERM", str(inner)], check=True)
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert time.monotonic() - started < 10
    assert code == 128 + signal.SIGTERM, proc.stderr.read() if proc.stderr else ""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found
