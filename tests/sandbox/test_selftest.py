"""The sandbox check's self-test (`scalerl sandbox-check` where the code pods run): a program in
the sandbox looks for what the process around it holds. A full sandbox lets it reach nothing; a
plain process, allowed by name only, reaches a file of its user and the network, and says so."""

from __future__ import annotations

import os

import pytest

from scalerl.cli import main
from scalerl.errors import SandboxUnavailable
from scalerl.generator import code_reward
from scalerl.sandbox import Sandbox, isolation, selftest


def test_a_full_sandbox_lets_the_search_reach_nothing() -> None:
    mode, found = selftest.check()
    assert mode.full and found == []


def test_a_plain_process_reaches_a_file_of_its_user_but_not_the_network_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = selftest.reached(isolation.plain("asked for in this test"))
    assert any(item.startswith("a file of this user (") for item in found)
    assert "the network (127.0.0.1)" not in found  # its filter refuses it every socket but Unix
    if os.geteuid() != 0:  # as root, plain programs run as nobody: root's /proc is closed
        assert any(item.startswith("/proc/") for item in found)
    plain = isolation.plain("bubblewrap refused in this test")
    monkeypatch.setattr(isolation, "probe", lambda: plain)
    with pytest.raises(SandboxUnavailable, match="bubblewrap refused in this test"):
        selftest.check()
    mode, said = selftest.check(allow_plain=True)  # by name: said, not raised
    assert mode is plain and any(item.startswith("a file of this user (") for item in said)


def test_scalerl_sandbox_check_says_what_it_made_reached_and_scored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sandbox-check"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "sandbox: bwrap",
        "a program in it reached nothing: not this process's environment nor any under /proc, "
        "not a file of this user, not 127.0.0.1",
        "it scored a right program +1 and a wrong one -1 in stdin/stdout, call-based, asserts "
        "tests",
    ]


def test_a_sandbox_that_scores_a_known_program_wrongly_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A harness that cannot read a program's output would score the right one -1 too.
    wrong = {**code_reward.KNOWN_PROBLEMS}
    reference, right, _ = wrong["asserts"]
    wrong["asserts"] = (reference, right, right)  # its "wrong" program passes: +1, not -1
    monkeypatch.setattr(code_reward, "KNOWN_PROBLEMS", wrong)
    assert main(["sandbox-check"]) == 3
    assert "scored known programs wrongly (right, wrong): {'asserts': (1.0, 1.0)}" in (
        capsys.readouterr().err
    )


def test_the_harness_scores_known_programs_in_a_sandbox_without_a_proc() -> None:
    no_proc = isolation.Isolation("bwrap", reason="a masked /proc, in this test", proc=False)
    with Sandbox(no_proc) as sandbox:
        scores = code_reward.known_scores(sandbox)
    assert scores == {shape: (1.0, -1.0) for shape in ("stdin/stdout", "call-based", "asserts")}
