"""A local run's OpenEnv server (spec.environment.openenv.app): started on 127.0.0.1 before the
generators, stopped with the run.

The server is `python -m uvicorn MODULE:ATTR` with the runner's own interpreter (the environment's
package is installed where scalerl is), on a free port, in a process group of its own, so that
stopping it takes any worker it started too. The generators find it by $SCALERL_OPENENV_URL, as
they find the operator's Service on a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from scalerl.environment import OPENENV_URL_VAR
from scalerl.errors import PeerError
from scalerl.ports import free_port

URL_VARIABLE = OPENENV_URL_VAR  # the server's base URL, in the generators' environment
FIELD = "spec.environment.openenv.app"
READY_TIMEOUT_S = 120.0  # an environment package may import a lot before it listens
STOP_GRACE_S = 10.0


class ServerFailed(PeerError):
    """The OpenEnv server did not come up (or died before it answered)."""


@dataclass
class LocalServer:
    app: str  # module:attribute
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls,
        app: str,
        log_path: Path,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        preexec_fn: Callable[[], None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> LocalServer:
        """Start `app` (with `environ` added to this process's environment) and wait until it
        answers /health; ServerFailed (the server's log tail in it) if it exits first or stays
        silent for `ready_timeout_s`."""
        port = free_port()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1"]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [*command, "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(environ or {})},
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        server = cls(app, f"http://127.0.0.1:{port}", process, log_path)
        try:
            server.wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerFailed(
                    f"{FIELD} {self.app!r}: the OpenEnv server exited with code {code} before "
                    f"it answered; its output ({self.log_path}):\n{self.tail()}"
                )
            if self.answers():
                return
            time.sleep(0.2)
        raise ServerFailed(
            f"{FIELD} {self.app!r}: the OpenEnv server did not answer {self.url}/health within "
            f"{timeout_s:g} s; its output ({self.log_path}):\n{self.tail()}"
        )

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`."""
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait()

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(text[-lines:]) or "(no output)"


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
