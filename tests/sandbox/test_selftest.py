"""The sandbox check's self-test (`scalerl sandbox-check` where the code pods run): a program in
the sandbox looks for what the process around it holds. A full sandbox lets it reach nothing; a
plain process, allowed by name only, reaches a file of its user and the network, and says so."""

from __future__ import annotations

import os

import pytest

from scalerl.errors import SandboxUnavailable
from scalerl.sandbox import isolation, selftest


def test_a_full_sandbox_lets_the_search_reach_nothing() -> None:
    mode, found = selftest.check()
    assert mode.full and found == []


def test_a_plain_process_reaches_the_file_and_the_network_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = selftest.reached(isolation.plain("asked for in this test"))
    assert any(item.startswith("a file of this user (") for item in found)
    assert "the network (127.0.0.1)" in found
    if os.geteuid() != 0:  # as root, plain programs run as nobody: root's /proc is closed
        assert any(item.startswith("/proc/") for item in found)
    plain = isolation.plain("bubblewrap refused in this test")
    monkeypatch.setattr(isolation, "probe", lambda: plain)
    with pytest.raises(SandboxUnavailable, match="bubblewrap refused in this test"):
        selftest.check()
    mode, said = selftest.check(allow_plain=True)  # by name: said, not raised
    assert mode is plain and "the network (127.0.0.1)" in said
