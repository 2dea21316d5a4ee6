"""Where namespaces are refused the sandbox still runs programs, with the limits that hold, and
says which guarantees are missing instead of pretending."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest

from scalerl.sandbox import Isolation, Limits, execute, isolation, selftest
from scalerl.sandbox.isolation import NO_NETWORK, PRIVATE_FILESYSTEM

LIMITS = Limits(wall_seconds=3.0, cpu_seconds=1, memory_bytes=256 << 20, output_bytes=1 << 16)


def test_without_bubblewrap_the_probe_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    isolation.probe.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="scalerl.sandbox.isolation"):
            found = isolation.probe()
    finally:
        isolation.probe.cache_clear()
    assert found.mode == "plain" and not found.full
    assert PRIVATE_FILESYSTEM in found.missing and NO_NETWORK not in found.missing
    assert (
        "bubblewrap (bwrap) is not installed" in caplog.text and PRIVATE_FILESYSTEM in caplog.text
    )


def test_a_plain_execution_keeps_its_limits_and_reports_what_it_lacks() -> None:
    plain = isolation.plain("namespaces refused in this test")
    echo = execute("print(input().upper())", b"hello\n", LIMITS, mode=plain)
    assert echo.returncode == 0 and echo.stdout == b"HELLO\n"
    assert echo.isolation.missing == plain.missing
    memory = execute("block = bytearray(10 * 1024**3)", limits=LIMITS, mode=plain)
    assert memory.memory_exceeded
    # The wall clock far above the CPU second: on a busy machine a loop may get a third of a core,
    # and it is the CPU limit this checks, not the wall clock.
    patient = dataclasses.replace(LIMITS, wall_seconds=60.0)
    loop = execute("while True:\n    pass\n", limits=patient, mode=plain)
    assert loop.signal is not None and not loop.timed_out  # the CPU limit ended it
    flood = execute("while True:\n    print('x' * 4096)\n", limits=LIMITS, mode=plain)
    assert flood.output_exceeded and len(flood.stdout) == LIMITS.output_bytes


# What bubblewrap says where a container's /proc is masked (a restricted pod; measured in Podman).
MASKED = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"


def test_where_the_kernel_refuses_the_sandbox_a_proc_it_goes_without_one(
    monkeypatch: pytest.MonkeyPatch, full_isolation: Isolation
) -> None:
    real, tried = isolation._try, []

    def masked_proc(fresh: bool, proc: bool = True) -> str:
        tried.append((fresh, proc))
        return MASKED if proc else real(fresh, proc)

    monkeypatch.setattr(isolation, "_try", masked_proc)
    isolation.probe.cache_clear()
    try:
        found = isolation.probe()
    finally:
        isolation.probe.cache_clear()
    assert tried == [(True, True), (True, False)]
    assert found.mode == "bwrap" and found.full and found.fresh and not found.proc
    assert "this /proc is masked" in found.reason and MASKED in found.reason


NO_PROC = Isolation("bwrap", reason="a masked /proc, in this test", proc=False)
NEW_USER_NAMESPACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
said = [libc.unshare(0x10000000), ctypes.get_errno()]  # CLONE_NEWUSER
said += [libc.syscall(435, None, 0), ctypes.get_errno()]  # clone3
print(said, os.path.exists('/proc'))
"""


def test_without_a_proc_programs_see_no_process_and_keep_every_limit(
    full_isolation: Isolation,
) -> None:
    looks = execute(NEW_USER_NAMESPACE, limits=LIMITS, mode=NO_PROC)
    assert looks.returncode == 0 and looks.isolation is NO_PROC, looks.stderr
    # No /proc; no user namespace of its own (EPERM), even without bubblewrap's --disable-userns,
    # which needs one; clone3 is not there (ENOSYS: the C library falls back to clone).
    assert looks.stdout == b"[-1, 1, -1, 38] False\n"
    # The self-test's search (other processes' environments, a file of this user, the network)
    # reaches nothing.
    assert selftest.reached(NO_PROC) == []
    memory = execute("block = bytearray(10 * 1024**3)", limits=LIMITS, mode=NO_PROC)
    assert memory.memory_exceeded
    patient = dataclasses.replace(LIMITS, wall_seconds=60.0)
    loop = execute("while True:\n    pass\n", limits=patient, mode=NO_PROC)
    assert loop.signal is not None and not loop.timed_out  # the CPU limit ended it
    threads = "import threading\nt = threading.Thread(target=print, args=('thread',))\n"
    started = execute(threads + "t.start()\nt.join()\n", limits=LIMITS, mode=NO_PROC)
    assert started.stdout == b"thread\n", started.stderr  # threads start without clone3


def test_in_every_mode_a_program_gets_no_namespace_of_its_own(full_isolation: Isolation) -> None:
    looks = execute(NEW_USER_NAMESPACE, limits=LIMITS)
    assert looks.returncode == 0 and looks.stdout == b"[-1, 1, -1, 38] True\n", looks.stderr
