"""One sandboxed execution: a Python program, its stdin, its limits -> what it printed and how it
ended. Nothing of it outlives the call: its processes are killed with their group (and, under
bubblewrap, their PID namespace) and its folder is removed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scalerl.sandbox import isolation
from scalerl.sandbox.isolation import Isolation

_LAUNCH = (Path(__file__).with_name("launch.py")).read_text()
MAIN = "main.py"
STDERR_BYTES = 64 << 10  # stderr kept (its tail); more than the output limit is killed too
_CHUNK = 1 << 16


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
        """The signal that ended the program, if one did (bubblewrap reports it as 128 + it)."""
        code = self.returncode
        if code is None or code == 0:
            return None
        if code < 0:
            return -code
        return code - 128 if self.isolation.mode == "bwrap" and code > 128 else None

    @property
    def memory_exceeded(self) -> bool:
        """The program ran out of its address space (Python says MemoryError)."""
        return b"MemoryError" in self.stderr[-4096:]


class _Output:
    """Reads a process's stdout and stderr (and feeds its stdin) until it ends, the wall clock
    runs out, or it prints more than allowed."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes, limits: Limits) -> None:
        self.proc, self.limits = proc, limits
        self.stdout, self.stderr = bytearray(), bytearray()
        self.pending = memoryview(stdin)
        self.stderr_seen = 0
        self.timed_out = self.exceeded = False

    def pump(self, deadline: float) -> None:
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ, self.stdout)
            sel.register(self.proc.stderr, selectors.EVENT_READ, self.stderr)
            if self.pending:
                os.set_blocking(self.proc.stdin.fileno(), False)
                sel.register(self.proc.stdin, selectors.EVENT_WRITE)
            else:
                self.proc.stdin.close()
            while len(sel.get_map()) and not (self.timed_out or self.exceeded):
                left = deadline - time.monotonic()
                if left <= 0:
                    self.timed_out = True
                    break
                for key, _ in sel.select(left):
                    self._serve(sel, key)

    def _serve(self, sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        if key.data is None:  # stdin
            try:
                sent = os.write(key.fd, self.pending[:_CHUNK])
            except (BrokenPipeError, BlockingIOError) as err:
                sent = 0 if isinstance(err, BlockingIOError) else len(self.pending)
            self.pending = self.pending[sent:]
            if not self.pending:
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            return
        chunk = os.read(key.fd, _CHUNK)
        if not chunk:
            sel.unregister(key.fileobj)
            return
        if key.data is self.stderr:  # its tail is kept: that is where a traceback ends
            self.stderr_seen += len(chunk)
            self.stderr += chunk
            del self.stderr[:-STDERR_BYTES]
            self.exceeded = self.stderr_seen > self.limits.output_bytes
            return
        room = self.limits.output_bytes - len(self.stdout)
        self.stdout += chunk[: max(room, 0)]
        self.exceeded = len(chunk) > room


def execute(
    program: str,
    stdin: bytes = b"",
    limits: Limits | None = None,
    files: dict[str, str] | None = None,
    mode: Isolation | None = None,
) -> Execution:
    """Run the Python `program` (saved as main.py, beside `files`) in a sandbox and wait for it.

    Never raises for anything the program does; a failure of the sandbox itself comes back as
    `Execution.error`."""
    limits = limits or Limits()
    mode = mode or isolation.probe()
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=base_folder()))
    try:
        _write(folder, {**(files or {}), MAIN: program})
        return _run(folder, stdin, limits, mode, started)
    except OSError as err:
        return Execution(None, b"", b"", time.monotonic() - started, error=str(err), isolation=mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def base_folder() -> Path:
    """Where executions' folders are made: scalerl-sandbox in the temporary directory, which
    others may enter but not list (bubblewrap, run as nobody, must reach a folder to bind it;
    a plain-mode program must not find another run's folder by listing)."""
    base = Path(tempfile.gettempdir()) / "scalerl-sandbox"
    base.mkdir(mode=0o711, exist_ok=True)
    return base


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        if path.resolve().parent != folder.resolve():
            raise OSError(f"sandbox file name {name!r} must be a plain name")
        path.write_text(text)
    uid = isolation.run_as()
    if uid is not None:  # root runs it as nobody: its folder must be nobody's
        for path in (folder, *folder.iterdir()):
            os.chown(path, uid, uid)


def _argv(folder: Path, limits: Limits, mode: Isolation) -> list[str]:
    processes = limits.processes
    python = isolation.interpreter()
    if mode.mode != "bwrap":
        # Outside a user namespace the kernel counts every process of the user: allow what the
        # user already runs, plus the program's own.
        processes += _tasks_of(isolation.run_as() or os.getuid())
    # launch.py reads them in this order.
    numbers = (limits.memory_bytes, limits.file_bytes, processes, limits.cpu_seconds)
    launch = [python, "-I", "-c", _LAUNCH, " ".join(map(str, numbers)), MAIN]
    return launch if mode.mode != "bwrap" else [*isolation.bwrap_argv(folder, python), *launch]


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                count += len(list((entry / "task").iterdir()))
        except OSError:
            continue
    return count


def _run(folder: Path, stdin: bytes, limits: Limits, mode: Isolation, started: float) -> Execution:
    # bubblewrap writes to its info pipe once the namespaces are set up: a run that ends without
    # it never reached the program (the sandbox failed), whatever the program could have printed.
    info_read, info_write = os.pipe()
    argv = _argv(folder, limits, mode)
    if mode.mode == "bwrap":
        argv[1:1] = ["--info-fd", str(info_write)]
    try:
        proc = _start(argv, folder, info_write)
    finally:
        os.close(info_write)
    deadline = started + limits.wall_seconds
    output = _Output(proc, stdin, limits)
    try:
        output.pump(deadline)
        if not (output.timed_out or output.exceeded):
            output.timed_out = _wait(proc, deadline)
    finally:
        os.set_blocking(info_read, False)
        with os.fdopen(info_read, "rb") as info:
            started_up = _kill(proc, info.read() or b"") or mode.mode != "bwrap"
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
    return Execution(
        returncode=proc.returncode,
        stdout=bytes(output.stdout),
        stderr=bytes(output.stderr),
        wall_seconds=time.monotonic() - started,
        timed_out=output.timed_out,
        output_exceeded=output.exceeded,
        error="" if started_up else _failure(output.stderr),
        isolation=mode,
    )


def _failure(stderr: bytearray) -> str:
    return "the sandbox did not start: " + (
        stderr.decode(errors="replace").strip()[:500] or "no message"
    )


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for a program that closed its output to exit; True when the wall clock ran out."""
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return True
    return False


def _start(argv: list[str], folder: Path, info_fd: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8"},
        start_new_session=True,
        pass_fds=(info_fd,),
        **isolation.as_sandbox_user(),
    )


def _kill(proc: subprocess.Popen[bytes], info: bytes) -> bool:
    """End the execution: kill the first process of its PID namespace (bubblewrap's, whose death
    kills every process in the namespace; `info` is bubblewrap's note of its pid), then the
    process group, and reap. Killing the namespace's first process rather than only the group
    lets bubblewrap reap it, so no zombie is left for the machine's init. True when `info` shows
    the sandbox had started."""
    try:
        inner = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        inner = 0
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
    return inner > 0


def _kill_child_of(parent: int, pid: int) -> None:
    """SIGKILL `pid` if it is still `parent`'s child (through a pidfd, so a recycled pid is
    never hit)."""
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
