"""Sandboxed executions: a Python program, its stdin, its limits -> what it printed and how it
ended. A `Sandbox` runs programs one after another (scalerl/sandbox/supervisor.py inside it forks
each; nothing of one is left for the next); `execute` runs one in a sandbox of its own. Nothing
outlives the sandbox: its processes die with their PID namespace (bubblewrap) or process group,
and its folder is removed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.sandbox import isolation
from scalerl.sandbox.isolation import SANDBOX_DIR, Isolation

_SUPERVISOR = (Path(__file__).with_name("supervisor.py")).read_text()
MAIN = "main.py"
STDERR_BYTES = 64 << 10  # stderr kept (its tail); more than the output limit is killed too
STARTUP_SECONDS = 30.0  # for bubblewrap and the supervisor's interpreter to start, on a busy node
ANSWER_SECONDS = 10.0  # after a job's wall limit, for the supervisor to kill, reap and clean up


@dataclass(frozen=True)
class Limits:
    """What one execution may use. `wall_seconds` bounds it from the outside (kill), the rest are
    kernel resource limits inside it; 0 means no limit for memory and files."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    processes: int = 32
    output_bytes: int = 16 << 20
    file_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        if self.wall_seconds <= 0 or self.cpu_seconds < 1 or self.processes < 1:
            raise ValueError(f"sandbox limits must be positive: {self}")


@dataclass(frozen=True)
class Execution:
    """How one execution ended. `returncode` is the program's exit status, or minus the signal
    that killed it; `error` is set when the sandbox itself failed (the program never ran, or we
    could not tell how it ended): such a run says nothing about the program."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    timed_out: bool = False
    output_exceeded: bool = False
    error: str = ""
    isolation: Isolation = Isolation("bwrap")

    @property
    def signal(self) -> int | None:
        """The signal that ended the program, if one did."""
        code = self.returncode
        return -code if code is not None and code < 0 else None

    @property
    def memory_exceeded(self) -> bool:
        """The program ran out of its address space (Python says MemoryError)."""
        return b"MemoryError" in self.stderr[-4096:]


class SandboxBroken(Exception):
    """The sandbox itself failed (did not start, stopped answering, ended)."""


class Sandbox:
    """A sandbox that runs programs one after another: bubblewrap (or, where namespaces are
    refused, a plain process) around scalerl/sandbox/supervisor.py, which forks each program
    under its own limits and clears everything it left before the next. Started at the first
    `run`, started anew after a failure; `close` (or leaving the `with`) ends it and all in it.

    One per thread: `run` sends a job and waits for its result."""

    def __init__(self, mode: Isolation | None = None) -> None:
        self.mode = mode or isolation.probe()
        self._proc: subprocess.Popen[bytes] | None = None
        self._inner = 0  # the supervisor's pid on this machine (bubblewrap's info), 0: unknown
        self._home: Path | None = None  # the plain mode's folder on this machine

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        program: str,
        stdin: bytes = b"",
        limits: Limits | None = None,
        files: dict[str, str] | None = None,
    ) -> Execution:
        """Run the Python `program` (as main.py, beside `files`) and wait for it. Never raises
        for anything the program does; a failure of the sandbox comes back as
        `Execution.error`."""
        limits = limits or Limits()
        job: dict[str, Any] = {"files": {**(files or {}), MAIN: program}, "main": MAIN}
        if bad := [n for n in job["files"] if not n or "/" in n or n in (".", "..")]:
            why = f"sandbox file name {bad[0]!r} must be a plain name"
            return Execution(None, b"", b"", 0.0, error=why, isolation=self.mode)
        if self._proc is not None and self._proc.poll() is not None:
            self.close()  # it ended since its last program (killed from outside): a new one
        try:
            proc = self._proc or self._start()
            job["limits"] = self._numbers(limits)
            started = time.monotonic()
            assert proc.stdin is not None
            _send(proc.stdin.fileno(), json.dumps(job).encode())
            _send(proc.stdin.fileno(), stdin)
            deadline = started + limits.wall_seconds + ANSWER_SECONDS
            header, out, err = (self._receive(deadline) for _ in range(3))
        except (SandboxBroken, OSError) as failed:
            why = str(failed)
            if not isinstance(failed, SandboxBroken):
                why = f"the sandbox failed: {why}"
            self.close()
            return Execution(None, b"", b"", 0.0, error=why, isolation=self.mode)
        result = json.loads(header)
        return Execution(
            returncode=result["returncode"],
            stdout=out,
            stderr=err,
            wall_seconds=time.monotonic() - started,
            timed_out=result["timed_out"],
            output_exceeded=result["output_exceeded"],
            isolation=self.mode,
        )

    def close(self) -> None:
        """End the supervisor (it exits when its input closes, and every program with it) and
        whatever is left of the sandbox; remove the plain mode's folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream:
                    stream.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(proc, self._inner)
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def _start(self) -> subprocess.Popen[bytes]:
        python = isolation.interpreter()
        supervisor = [python, "-I", "-c", _SUPERVISOR]
        info_read, info_write = os.pipe()
        if self.mode.mode == "bwrap":
            argv = [*isolation.bwrap_argv(python), *supervisor, "namespace"]
            argv[1:1] = ["--info-fd", str(info_write)]
            home, cwd = SANDBOX_DIR, Path("/")
        else:
            self._home = Path(tempfile.mkdtemp(prefix="run-", dir=base_folder()))
            _give_to_sandbox_user(self._home)
            argv, home, cwd = [*supervisor, "plain"], str(self._home), self._home
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env={"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"},
                start_new_session=True,
                pass_fds=(info_write,),
                **isolation.as_sandbox_user(),
            )
        finally:
            os.close(info_write)
        try:
            ready = self._receive(time.monotonic() + STARTUP_SECONDS, starting=True)
        finally:
            self._inner = _inner_pid(info_read)
        if ready != b"ready":
            raise SandboxBroken(f"the sandbox did not start: it said {ready[:100]!r}")
        return self._proc

    def _numbers(self, limits: Limits) -> list[float]:
        """The limits as supervisor.py reads them. The kernel counts processes per user (of a
        user namespace): the sandbox's own supervisor counts, and outside a namespace every
        process the user already runs does."""
        others = 1 if self.mode.mode == "bwrap" else _tasks_of(isolation.run_as() or os.getuid())
        return [
            limits.memory_bytes,
            limits.file_bytes,
            limits.processes + others,
            limits.cpu_seconds,
            limits.wall_seconds,
            limits.output_bytes,
            STDERR_BYTES,
        ]

    def _receive(self, deadline: float, starting: bool = False) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        size = _read(fd, 4, deadline)
        data = _read(fd, struct.unpack(">I", size)[0], deadline) if size is not None else None
        if data is not None:
            return data
        if self._proc.poll() is None and time.monotonic() >= deadline:
            raise SandboxBroken("the sandbox stopped answering")
        self._proc.wait(timeout=5)
        said = (self._proc.stderr.read() if self._proc.stderr else b"")[-2000:]
        text = said.decode(errors="replace").strip()[:500] or f"exit {self._proc.returncode}"
        raise SandboxBroken(f"the sandbox {'did not start' if starting else 'ended'}: {text}")


class PerThread:
    """One kept `Sandbox` for each thread that asks (a pool's workers), closed all together."""

    def __init__(self, mode: Isolation | None = None) -> None:
        self.mode = mode
        self._local = threading.local()
        self._all: list[Sandbox] = []
        self._lock = threading.Lock()

    def get(self) -> Sandbox:
        box: Sandbox | None = getattr(self._local, "box", None)
        if box is None:
            box = self._local.box = Sandbox(self.mode)
            with self._lock:
                self._all.append(box)
        return box

    def close(self) -> None:
        with self._lock:
            boxes, self._all = self._all, []
        for box in boxes:
            box.close()


def execute(
    program: str,
    stdin: bytes = b"",
    limits: Limits | None = None,
    files: dict[str, str] | None = None,
    mode: Isolation | None = None,
) -> Execution:
    """One program in a sandbox of its own (see `Sandbox.run`), started and ended around it."""
    with Sandbox(mode) as box:
        return box.run(program, stdin, limits, files)


def base_folder() -> Path:
    """Where the plain mode's folders are made: scalerl-sandbox in the temporary directory,
    which others may enter but not list (a plain-mode program must not find another's folder by
    listing)."""
    base = Path(tempfile.gettempdir()) / "scalerl-sandbox"
    base.mkdir(mode=0o711, exist_ok=True)
    return base


def _give_to_sandbox_user(folder: Path) -> None:
    uid = isolation.run_as()
    if uid is not None:  # root runs it as nobody: its folder must be nobody's
        os.chown(folder, uid, uid)


def _send(fd: int, data: bytes) -> None:
    data = struct.pack(">I", len(data)) + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read(fd: int, size: int, deadline: float) -> bytes | None:
    """`size` bytes of `fd`; None at its end or when `deadline` passes first."""
    parts: list[bytes] = []
    left = size
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not sel.select(wait):
                return None
            part = os.read(fd, min(left, 1 << 20))
            if not part:
                return None
            parts.append(part)
            left -= len(part)
    return b"".join(parts)


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                count += len(list((entry / "task").iterdir()))
        except OSError:
            continue
    return count


def _inner_pid(info_read: int) -> int:
    """The supervisor's pid as bubblewrap notes it on its info pipe (0 when it wrote none)."""
    os.set_blocking(info_read, False)
    with os.fdopen(info_read, "rb") as info:
        try:
            return int(json.loads(info.read() or b"{}")["child-pid"])
        except (ValueError, KeyError, TypeError, OSError):
            return 0


def _kill(proc: subprocess.Popen[bytes], inner: int) -> None:
    """Kill a sandbox that did not end when asked: the first process of its PID namespace
    (whose death kills every process in it; through a pidfd, so a recycled pid is never hit),
    then the process group, and reap."""
    if inner and proc.poll() is None:
        _kill_child_of(proc.pid, inner)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _kill_child_of(parent: int, pid: int) -> None:
    """SIGKILL `pid` if it is still `parent`'s child."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        if f"\nPPid:\t{parent}\n" in status:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)
