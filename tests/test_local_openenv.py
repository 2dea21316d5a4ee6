"""`scalerl run` with spec.environment.openenv.app: the runner starts the OpenEnv server on
127.0.0.1 before the processes, gives them its URL, and stops it with the run, also when the run
fails or the runner itself is killed. The server is environments/openenv_calculator, pip-installed
as a user's package; no trainer or generator is started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from editable import install_editable

from scalerl import local
from scalerl.environment import OPENENV_URL_VAR
from scalerl.errors import PeerError
from scalerl.spec import ScaleRLRun, parse_run

APP = "openenv_calculator.server:app"


@pytest.fixture(scope="module", autouse=True)
def calculator_installed() -> None:
    install_editable("openenv_calculator")


def calculator_run(tmp_path: Path) -> ScaleRLRun:
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(json.dumps({"prompt": f"{i}*2?", "answer": 2 * i}) + "\n" for i in range(8))
    )
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "calculator"},
            "spec": {
                "model": {"path": "/models/base"},
                "data": {"train": str(train), "validation": {"prompts": 2}},
                "environment": {"openenv": {"app": APP}},
                "generators": {"replicas": 2, "gpus": 0},
                "trainers": {"replicas": 1, "gpus": 0},
            },
        }
    )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_the_processes_get_the_servers_url_and_a_failed_run_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = local.LocalRun(calculator_run(tmp_path), tmp_path / "out", display=False)
    seen: dict[str, Any] = {}

    def attempt() -> bool:
        """The gang's launch, its processes' environments recorded instead of started, then
        a failure the run does not survive."""
        server = run.env_server
        assert server is not None and answers(server.url)
        started: dict[str, dict[str, str]] = {}
        real = subprocess.Popen

        def popen(command: list[str], *, env: dict[str, str], **_: Any) -> Any:
            started[command[-1] + str(len(started))] = env
            return real([sys.executable, "-c", "pass"])  # a process that ends at once

        monkeypatch.setattr(local.subprocess, "Popen", popen)
        run.launch()
        monkeypatch.undo()
        seen.update(url=server.url, environs=started, server=server)
        raise PeerError("generator-0 exited with code 1")

    monkeypatch.setattr(run, "attempt", attempt)
    with pytest.raises(PeerError, match="generator-0"):
        run.execute()
    assert len(seen["environs"]) == 3  # a trainer and two generators
    assert {e[OPENENV_URL_VAR] for e in seen["environs"].values()} == {seen["url"]}
    assert seen["url"].startswith("http://127.0.0.1:")
    assert seen["server"].process.poll() is not None and not answers(seen["url"])
    assert "Uvicorn running" in (tmp_path / "out" / "logs" / "openenv.log").read_text()


RUNNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from scalerl import local
    from scalerl.agents.openenv_server import LocalServer
    server = LocalServer.start(sys.argv[1], Path(sys.argv[2]), preexec_fn=local._die_with_parent)
    print(server.process.pid, flush=True)
    time.sleep(600)
    """
)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited; its new parent has yet to reap it


def test_a_killed_runner_leaves_no_server_behind(tmp_path: Path) -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, APP, str(tmp_path / "openenv.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert runner.stdout is not None
        pid = int(runner.stdout.readline())
        assert not gone(pid)
        os.kill(runner.pid, signal.SIGKILL)  # no finally, no atexit: the kernel's signal alone
        runner.wait()
        deadline = time.monotonic() + 30
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(pid), f"the server {pid} outlived its runner"
    finally:
        runner.kill()


def test_validate_deep_starts_the_app_for_its_check_and_stops_it(tmp_path: Path) -> None:
    from scalerl.preflight import problems_of

    problems = problems_of(calculator_run(tmp_path))
    # Only the model is missing: the environment loaded, from a server started for the check.
    assert [p.split(":")[0] for p in problems] == ["spec.model.path"], problems
    assert OPENENV_URL_VAR not in os.environ
