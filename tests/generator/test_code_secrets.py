"""What a generator (or a colocated run's one process) holds stays out of reach of the programs it
scores: a program run by the `code` reward, in the process that scores it, finds no secret in its
environment, none in any process's environment under /proc, no token file, and no network. The
program (the sandbox check's own search, scalerl.sandbox.selftest) prints what it found, and its
test expects nothing: the reward itself says whether anything leaked."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerl.generator.scoring import Scorer
from scalerl.sandbox.selftest import SEARCH
from scalerl.spec import CodeSpec


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on this machine that accepts connections: what a program must not reach."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def test_a_scored_program_finds_no_secret_token_environment_or_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: int
) -> None:
    secret = f"scalerl-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("WANDB_API_KEY", secret)  # a tracker's key, as a colocated pod holds it
    token = tmp_path / "token"  # a mounted ServiceAccount token, readable by the pod's user
    token.write_text(secret)
    token.chmod(0o644)
    tmp_path.chmod(0o755)
    reference = json.dumps({"inputs": [f"{secret}\n{token}\n{listener}\n"], "outputs": ["[]\n"]})
    answer = f"```python\n{SEARCH}\n```"
    scorer = Scorer("code", CodeSpec())
    try:
        reward = scorer.score_program(answer, reference)
    finally:
        scorer.close()
    assert reward == 1.0  # it printed [] : it found nothing


def test_the_same_search_finds_them_all_outside_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: int
) -> None:
    """The search above is not blind: run as a plain child of this process, it finds each."""
    import subprocess
    import sys

    secret = f"scalerl-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    token = tmp_path / "token"
    token.write_text(secret)
    done = subprocess.run(
        [sys.executable, "-c", SEARCH],
        input=f"{secret}\n{token}\n{listener}\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = done.stdout
    assert "its environment" in found and str(token) in found and "the network" in found
    assert "/proc/" in found  # its own, and this process's, environments
