"""Where namespaces are refused the sandbox still runs programs, with the limits that hold, and
says which guarantees are missing instead of pretending."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest

from scalerl.sandbox import Limits, execute, isolation
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
    assert NO_NETWORK in found.missing and PRIVATE_FILESYSTEM in found.missing
    assert "bubblewrap (bwrap) is not installed" in caplog.text and NO_NETWORK in caplog.text


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
