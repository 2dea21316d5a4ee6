"""The local runner's gang: when processes die together, the report leads with the likeliest
cause, and names every one that died."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scalerl.local import Gang


def dead(gang: Gang, tmp_path: Path, role: str, code: str) -> None:
    """A finished process of `role` whose log says how it ended."""
    log = tmp_path / f"{role}.log"
    log.write_text(f"{role} log line\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    proc.wait()
    gang.processes[role], gang.logs[role] = proc, log


def test_a_rank_killed_by_a_signal_leads_the_report_over_the_rank_its_death_failed(
    tmp_path: Path,
) -> None:
    gang = Gang()
    # trainer-0's collective failed because trainer-1 was killed: both are dead at the next look.
    dead(gang, tmp_path, "trainer-0", "raise SystemExit(1)")
    dead(gang, tmp_path, "trainer-1", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    dead(gang, tmp_path, "generator-0", "raise SystemExit(0)")

    failed = gang.failed()

    assert failed == ["trainer-1", "trainer-0"]
    report = gang.describe(failed)
    assert report.startswith("trainer-1 exited with code -9:\ntrainer-1 log line\n")
    assert "trainer-0 exited with code 1:\ntrainer-0 log line" in report
    assert "generator-0" not in report


def test_a_gang_that_is_running_or_done_has_no_failures(tmp_path: Path) -> None:
    gang = Gang()
    dead(gang, tmp_path, "trainer-0", "raise SystemExit(0)")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gang.processes["generator-0"] = running
    try:
        assert gang.failed() == []
    finally:
        running.kill()
        running.wait()
