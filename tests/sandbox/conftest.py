"""The sandbox's tests need bubblewrap and user namespaces. CI installs bubblewrap (.ci/run), so
there a machine without full isolation is a failure; on a workstation it is a skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerl.sandbox import Isolation, probe
from scalerl.sandbox.isolation import run_as
from scalerl.sandbox.run import base_folder

LAUNCHER_MARK = b"The first process of a sandbox"  # scalerl/sandbox/supervisor.py's first line


@pytest.fixture(scope="session")
def full_isolation() -> Isolation:
    isolation = probe()
    if not isolation.full:
        message = f"the sandbox lacks {', '.join(isolation.missing)}: {isolation.reason}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return isolation


def sandbox_processes() -> dict[int, str]:
    """Processes that are the sandbox's: those of the user sandboxes run as when we are root;
    else bubblewrap or an interpreter running the sandbox's launcher (its text is on the
    command line). Only this process's own (its descendants, and orphans, which init adopted):
    under pytest-xdist another worker runs sandboxes of its own meanwhile. Each is said with
    the line of processes it descends from, to tell who started it."""
    found, parent, names = [], {}, {}
    uid = run_as()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            owner = entry.stat().st_uid
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        names[int(entry.name)] = cmdline[:60]
        # Exited or exiting (the kernel has released its memory; a zombie waits for init to
        # reap it): nothing of it runs any more. Counted, a killed supervisor's program was
        # "left behind" for the instant between its exit and init's reaping.
        if not cmdline:
            continue
        program = Path(cmdline.split(b"\0", 1)[0].decode(errors="replace")).name
        if (uid is not None and owner == uid) or program == "bwrap" or LAUNCHER_MARK in cmdline:
            found.append(int(entry.name))
    candidates = set(found)
    return {
        pid: f"{pid}: {names[pid][:80]!r}, below {_line(pid, parent, names)}"
        for pid in found
        if _ours_or_orphaned(pid, parent, candidates)
    }


def _line(pid: int, parent: dict[int, int], names: dict[int, bytes]) -> str:
    """The processes `pid` descends from, nearest first, up to this one or init."""
    above = []
    pid = parent.get(pid, 0)
    while pid > 1 and pid != os.getpid() and len(above) < 8:
        above.append(f"{pid} {names.get(pid, b'')[:40]!r}")
        pid = parent.get(pid, 0)
    return " < ".join([*above, "this process" if pid == os.getpid() else "init"])


def _ours_or_orphaned(pid: int, parent: dict[int, int], candidates: set[int]) -> bool:
    """Whether `pid` descends from this process, or from a sandbox process init adopted."""
    seen = set()
    while pid not in seen and pid > 1:
        seen.add(pid)
        up = parent.get(pid, 0)
        if up == os.getpid() or (up == 1 and pid in candidates):
            return True
        pid = up
    return False


@pytest.fixture
def nothing_left_behind(full_isolation: Isolation) -> Iterator[None]:
    """After the test: no sandbox process it started still exists and no folder of its is left.
    (Sandboxes that were there before it stay out of the count: a `code` reward loaded by an
    earlier test of the session keeps one per thread until the process exits.)"""
    processes, folders = sandbox_processes(), set(base_folder().iterdir())
    yield
    assert [said for pid, said in sandbox_processes().items() if pid not in processes] == []
    assert [f for f in base_folder().iterdir() if f not in folders] == []
