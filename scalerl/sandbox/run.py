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
import socket
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
CHUNK = 1 << 16
STARTUP_SECONDS = 30.0  # for bubblewrap and the supervisor's interpreter to start, on a busy node
ANSWER_SECONDS = 10.0  # after a job's wall limit, for the supervisor to kill, reap and clean up
# For a program's child to be set up (a fork, mounts, limits) before its wall clock starts: a
# busy host can hold the mount locks for seconds, which is no program's time.
SETUP_SECONDS = 30.0


@dataclass(frozen=True)
class Limits:
    """What one execution may use. `wall_seconds` bounds it from the outside (kill), the rest are
    kernel resource limits on each of its processes; with bubblewrap, `cpu_seconds` and
    `memory_bytes` also bound all its processes together (the supervisor adds them up). 0 means
    no limit for memory and files."""

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
    that killed it.

    Two kinds of sandbox failure, told apart by who could have caused them:

    - `error` (unscored): the program never ran: the sandbox could not start (no bubblewrap,
      namespaces refused) or could not start it (the host out of memory or processes). Such a
      run says nothing about the program.
    - `damaged`: the sandbox stopped being sound while the program ran (its supervisor ended or
      stopped answering, what it wrote could not be emptied in time). That is the program's doing
      (nothing else runs there): it failed. The sandbox is started anew for the next one."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    timed_out: bool = False
    output_exceeded: bool = False
    error: str = ""
    isolation: Isolation = Isolation("bwrap")
    damaged: str = ""
    cpu_exceeded: bool = False  # its processes together used more CPU than its limit
    memory_total_exceeded: bool = False  # its processes together held more memory than its limit

    @property
    def signal(self) -> int | None:
        """The signal that ended the program, if one did."""
        code = self.returncode
        return -code if code is not None and code < 0 else None

    @property
    def memory_exceeded(self) -> bool:
        """The program ran out of its memory (Python says MemoryError, or its processes together
        held more than its limit)."""
        return self.memory_total_exceeded or b"MemoryError" in self.stderr[-4096:]


class SandboxBroken(Exception):
    """The sandbox itself failed (did not start, stopped answering, ended)."""


class Sandbox:
    """A sandbox that runs programs one after another: bubblewrap (or, where namespaces are
    refused, a plain process) around scalerl/sandbox/supervisor.py, which forks each program
    under its own limits and clears everything it left before the next. Started at the first
    `run`, started anew after a failure; `close` (or leaving the `with`) ends it and all in it.

    The program's stdin, stdout and stderr are pipes made here, fed and read here; the supervisor
    only hands them to the program's process (over a Unix socket), so no program's data ever
    passes through the process every program is forked from.

    One per thread: `run` sends a job and waits for its result."""

    def __init__(self, mode: Isolation | None = None) -> None:
        # Plain processes only when asked for by name (an Isolation passed in): by default a
        # machine that refuses the sandbox raises SandboxUnavailable (`isolation.required`).
        self.mode = mode or isolation.required()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
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
        for anything the program does: what it did to the sandbox comes back as
        `Execution.damaged`; a failure no program could cause as `Execution.error`."""
        limits = limits or Limits()
        named = {**(files or {}), MAIN: program}
        if bad := [n for n in named if not n or "/" in n or n in (".", "..")]:
            why = f"sandbox file name {bad[0]!r} must be a plain name"
            return Execution(None, b"", b"", 0.0, error=why, isolation=self.mode)
        header = {"main": MAIN, "limits": self._numbers(limits), "setup": SETUP_SECONDS}
        # A supervisor that ended between programs (killed from outside, the host's OOM killer)
        # is no program's doing: one new start, then the failure is unscored.
        for attempt in (1, 2):
            if self._proc is not None and self._proc.poll() is not None:
                self.close()
            try:
                if self._proc is None:
                    self._start()
                pipes = self._send(json.dumps(header).encode(), named)
                break
            except (SandboxBroken, OSError) as failed:
                self.close()
                why = (
                    str(failed)
                    if isinstance(failed, SandboxBroken)
                    else f"the sandbox failed: {failed}"
                )
                if attempt == 2 or isinstance(failed, SandboxBroken):
                    return Execution(None, b"", b"", 0.0, error=why, isolation=self.mode)
        started = time.monotonic()
        pump = Pump(pipes, stdin, limits.output_bytes, STDERR_BYTES)
        try:
            result = self._wait(pump, started + SETUP_SECONDS + ANSWER_SECONDS, limits)
        except SandboxBroken as broken:
            self.close()
            pump.close()
            return Execution(
                None,
                bytes(pump.stdout),
                bytes(pump.stderr),
                time.monotonic() - started,
                output_exceeded=pump.exceeded,
                damaged=str(broken),
                isolation=self.mode,
            )
        pump.drain()
        if result.get("unscored"):
            self.close()
            return Execution(None, b"", b"", 0.0, error=result["unscored"], isolation=self.mode)
        if result.get("damaged"):
            self.close()
        return Execution(
            returncode=result["returncode"],
            stdout=bytes(pump.stdout),
            stderr=bytes(pump.stderr),
            wall_seconds=time.monotonic() - started,
            timed_out=result["timed_out"],
            output_exceeded=pump.exceeded,
            isolation=self.mode,
            damaged=result.get("damaged", ""),
            cpu_exceeded=result["cpu_exceeded"],
            memory_total_exceeded=result["memory_exceeded"],
        )

    def close(self) -> None:
        """End the supervisor (it exits when its socket closes, and every program with it) and
        whatever is left of the sandbox; remove the plain mode's folder."""
        proc, self._proc = self._proc, None
        control, self._control = self._control, None
        if control is not None:
            control.close()
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

    def _start(self) -> None:
        python = isolation.interpreter()
        supervisor = [python, "-I", "-c", _SUPERVISOR]
        info_read, info_write = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        passed = [info_write]
        if self.mode.mode == "bwrap":
            argv = [*isolation.bwrap_argv(python, self.mode.fresh, self.mode.proc), *supervisor]
            argv += ["fresh" if self.mode.fresh else "namespace"]
            if self.mode.proc:
                argv.append("proc")
            else:  # the supervisor adds up a program's processes in our /proc
                passed.append(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY))
                argv.append(f"outer-proc={passed[-1]}")
            argv[1:1] = ["--info-fd", str(info_write)]
            home, cwd = SANDBOX_DIR, Path("/")
        else:
            self._home = Path(tempfile.mkdtemp(prefix="run-", dir=base_folder()))
            _give_to_sandbox_user(self._home)
            argv, home, cwd = [*supervisor, "plain"], str(self._home), self._home
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env={"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"},
                start_new_session=True,
                pass_fds=passed,
                **isolation.as_sandbox_user(),
            )
        finally:
            for fd in passed:
                os.close(fd)
            theirs.close()
        self._control = ours
        try:
            ready = self._receive(time.monotonic() + STARTUP_SECONDS, starting=True)
        finally:
            self._inner = _inner_pid(info_read)
        if ready != b"ready":
            raise SandboxBroken(f"the sandbox did not start: it said {ready[:100]!r}")

    def _send(self, header: bytes, files: dict[str, str]) -> tuple[int, int, int]:
        """The job, with the program's ends of three new pipes and a memfd of its files; ours
        (its stdin to write, its stdout and stderr to read) come back."""
        assert self._control is not None
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        memfd = os.memfd_create("job", os.MFD_CLOEXEC)
        try:
            data = memoryview(json.dumps(files).encode())
            while data:
                data = data[os.write(memfd, data) :]
            socket.send_fds(self._control, [header], [stdin_r, out_w, err_w, memfd])
        except OSError:
            for fd in (stdin_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w, err_w, memfd):
                os.close(fd)
        return stdin_w, out_r, err_r

    def _wait(self, pump: Pump, deadline: float, limits: Limits) -> dict[str, Any]:
        """Feed and read the program until the supervisor's result comes; ask it to kill the
        program once its output passes the limit. `deadline` is for its setup; once the
        supervisor says it started, its wall limit (and the supervisor's time to answer)."""
        assert self._control is not None
        control = self._control
        asked = False
        with selectors.DefaultSelector() as sel:
            sel.register(control, selectors.EVENT_READ, "result")
            pump.register(sel)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxBroken("the sandbox stopped answering")
                for key, _ in sel.select(left):
                    if key.data == "result":
                        try:
                            message = control.recv(1 << 16)
                        except OSError:
                            message = b""
                        if not message:
                            raise SandboxBroken(f"the sandbox ended: {self._said()}")
                        if message == b"started":
                            deadline = time.monotonic() + limits.wall_seconds + ANSWER_SECONDS
                            continue
                        result: dict[str, Any] = json.loads(message)
                        return result
                    pump.ready(sel, key)
                if pump.exceeded and not asked:
                    try:
                        control.send(b"kill")
                    except OSError as err:
                        raise SandboxBroken(f"the sandbox ended: {self._said()}") from err
                    asked = True

    def _said(self) -> str:
        """What the ended supervisor wrote on its stderr (its traceback), or its exit status."""
        proc = self._proc
        if proc is None:
            return "closed"
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        said = (proc.stderr.read() if proc.stderr else b"")[-2000:]
        return said.decode(errors="replace").strip()[:500] or f"exit {proc.returncode}"

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
        ]

    def _receive(self, deadline: float, starting: bool = False) -> bytes:
        assert self._control is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._control, selectors.EVENT_READ)
            if sel.select(max(deadline - time.monotonic(), 0)):
                data = self._control.recv(1 << 16)
                if data:
                    return data
        assert self._proc is not None
        if self._proc.poll() is None and time.monotonic() >= deadline:
            raise SandboxBroken("the sandbox stopped answering")
        raise SandboxBroken(
            f"the sandbox {'did not start' if starting else 'ended'}: {self._said()}"
        )


class Pump:
    """Feeds a program's stdin and reads its stdout (up to the limit) and the tail of its stderr
    (counted against the same limit), without blocking."""

    def __init__(
        self, pipes: tuple[int, int, int], stdin: bytes, output_bytes: int, stderr_kept: int
    ) -> None:
        self.stdin_fd, self.out_fd, self.err_fd = pipes
        for fd in pipes:
            os.set_blocking(fd, False)
        self.pending = memoryview(stdin)
        self.output_bytes, self.stderr_kept = output_bytes, stderr_kept
        self.stdout, self.stderr = bytearray(), bytearray()
        self.stderr_seen = 0
        self.exceeded = False
        self.open = {self.out_fd, self.err_fd}
        if not self.pending:
            self._close_stdin()

    def register(self, sel: selectors.BaseSelector) -> None:
        for fd in (self.out_fd, self.err_fd):
            sel.register(fd, selectors.EVENT_READ, "read")
        if self.stdin_fd >= 0:
            sel.register(self.stdin_fd, selectors.EVENT_WRITE, "write")

    def ready(self, sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        if key.data == "write":
            self._feed(sel)
        elif self.exceeded or not self._read(key.fd):
            sel.unregister(key.fd)  # at its end, or past the limit: no more reading

    def _feed(self, sel: selectors.BaseSelector) -> None:
        try:
            sent = os.write(self.stdin_fd, self.pending[:CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:  # the program stopped reading: what it did not read is dropped
            sent = len(self.pending)
        self.pending = self.pending[sent:]
        if not self.pending:
            sel.unregister(self.stdin_fd)
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.stdin_fd >= 0:
            os.close(self.stdin_fd)
            self.stdin_fd = -1

    def _read(self, fd: int) -> bool:
        """One read of `fd`; False at its end (or when nothing more is there to read)."""
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        if fd == self.err_fd:  # its tail is kept: that is where a traceback ends
            self.stderr_seen += len(chunk)
            self.stderr += chunk
            del self.stderr[: -self.stderr_kept]
            self.exceeded = self.exceeded or self.stderr_seen > self.output_bytes
            return True
        room = self.output_bytes - len(self.stdout)
        self.stdout += chunk[: max(room, 0)]
        self.exceeded = self.exceeded or len(chunk) > room
        return True

    def drain(self) -> None:
        """What the program wrote before it ended and was not read yet (every writer is gone:
        the supervisor killed and reaped all of the program's processes); then close."""
        for fd in (self.out_fd, self.err_fd):
            while not self.exceeded:
                try:
                    more = self._read(fd)
                except OSError:
                    break
                if not more or not _readable_now(fd):  # at its end, or a writer outlived it
                    break
        self.close()

    def close(self) -> None:
        self._close_stdin()
        for fd in (self.out_fd, self.err_fd):
            if fd in self.open:
                os.close(fd)
                self.open.discard(fd)


def _readable_now(fd: int) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(0))


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
