"""The first process of a sandbox: it runs the programs it is sent, one at a time, each in a
forked child under its own limits, and leaves nothing of one program for the next.

Started by scalerl.sandbox.run as `python -I -c <this file's text> MODE` (MODE "namespace": it is
the first process of its own PID, mount and IPC namespaces, as bubblewrap's `--as-pid-1` makes it;
"plain": an ordinary process, where namespaces are refused). Not imported by scalerl; standard
library only, any Python 3.9+: the sandbox's interpreter is the system's, without scalerl.

Why a long-lived process: starting bubblewrap and an interpreter for every program cost more than
most programs run. A forked child of this (already started) interpreter starts in about a
millisecond, gets fresh CPU, memory, file-size and process-count limits (rlimits are per process,
CPU time starts at zero), and a fresh folder. Between programs, every process but this one is
killed (`kill(-1)` from a namespace's first process reaches all the others and never itself) and
reaped, and every place a program may write (its folder, /tmp, /dev/shm) is emptied, with the
System V IPC objects of the namespace. This process is out of the programs' reach: a namespace's
first process takes no signal it has no handler for from inside, and it is not dumpable, so a
program of the same user can neither trace it nor read its memory. The program's child is a copy
of this process, which holds only the current job: the expected outputs never come in.

Protocol, on this process's stdin and stdout (pipes to scalerl.sandbox.run): every message is a
4-byte big-endian length and that many bytes. First this process sends `ready`. A job is two
messages, a JSON header {"files": {name: text}, "main": name, "limits": [memory, files, processes,
cpu, wall, output, stderr_kept]} and the program's stdin; its result is three, a JSON header
{"returncode": int (minus the signal that ended it), "timed_out": bool, "output_exceeded": bool},
the stdout and the tail of the stderr.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import resource
import selectors
import shutil
import signal
import struct
import sys
import time
import traceback
from typing import Any, NoReturn

NAMESPACE = sys.argv[1] == "namespace"
PR_SET_DUMPABLE = 4
IPC_RMID = 0
CHUNK = 1 << 16
LIBC = ctypes.CDLL(None, use_errno=True)  # the C library this interpreter runs on


def send(fd: int, data: bytes) -> None:
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def receive(fd: int) -> bytes | None:
    head = read_exactly(fd, 4)
    return read_exactly(fd, struct.unpack(">I", head)[0]) if head else None


def read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


# --- the child: one program -------------------------------------------------------------------


def limit(which: int, value: int) -> None:
    if value > 0:
        resource.setrlimit(which, (value, value))


def run_program(
    folder: str, main: str, stdin_fd: int, out_fd: int, err_fd: int, limits: list[int]
) -> NoReturn:
    """In the forked child: the program as `__main__`, as `python main.py` would run it. Never
    returns."""
    memory, files, processes, cpu = limits[:4]
    os.setsid()
    LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # an ordinary process (this one is not dumpable)
    for fd, target in ((stdin_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)
    # Soft and hard alike: past the CPU limit the kernel kills (SIGXCPU, then SIGKILL).
    limit(resource.RLIMIT_CPU, cpu)
    limit(resource.RLIMIT_AS, memory)
    limit(resource.RLIMIT_FSIZE, files)
    limit(resource.RLIMIT_NPROC, processes)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir(folder)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = [main]
    sys.path.insert(0, ".")
    module = type(sys)("__main__")
    module.__file__ = main
    sys.modules["__main__"] = module
    try:
        with open(main, "rb") as file:
            code = compile(file.read(), main, "exec")
        exec(code, module.__dict__)
        status = 0
    except SystemExit as stop:
        status = exit_status(stop.code)
    except BaseException:  # what `python main.py` does with an uncaught exception
        traceback.print_exc()
        status = 1
    os._exit(finish(status))


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(status: int) -> int:
    """What Python's own exit does that a program can notice (its other threads joined, its
    atexit functions run, its output flushed), without the rest: tearing down a forked
    interpreter costs ~30 ms, ten times the fork."""
    threading = sys.modules.get("threading")
    if threading is not None:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 — as Python: output it could not write is exit 120
            status = status or 120
    return status


# --- this process: one job after another ------------------------------------------------------


def serve(job_in: int, job_out: int, home: str) -> None:
    send(job_out, b"ready")
    number = 0
    while True:
        header = receive(job_in)
        stdin = receive(job_in)
        if header is None or stdin is None:
            return
        job = json.loads(header)
        number += 1
        folder = os.path.join(home, f"job-{number}-{os.urandom(4).hex()}")
        os.mkdir(folder, 0o700)
        for name, text in job["files"].items():
            with open(os.path.join(folder, name), "w") as file:
                file.write(text)
        result, stdout, stderr = run_job(folder, job, stdin)
        clean(home)
        send(job_out, json.dumps(result).encode())
        send(job_out, stdout)
        send(job_out, stderr)


def run_job(folder: str, job: dict[str, Any], stdin: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    limits = job["limits"]
    wall, output_bytes, stderr_kept = limits[4], limits[5], limits[6]
    pipes = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    pid = os.fork()
    if pid == 0:
        run_program(folder, job["main"], pipes[0][0], pipes[1][1], pipes[2][1], limits)
    for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(fd)
    watch = Watch(pid, pipes[0][1], pipes[1][0], pipes[2][0], stdin, output_bytes, stderr_kept)
    watch.pump(time.monotonic() + wall)
    kill_all(pid)
    status = os.waitpid(pid, 0)[1]
    reap_rest()
    watch.drain()
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    result = {"returncode": code, "timed_out": watch.timed_out, "output_exceeded": watch.exceeded}
    return result, bytes(watch.stdout), bytes(watch.stderr)


class Watch:
    """Feeds the child's stdin and reads its stdout and stderr until it exits, the wall clock
    runs out, or it prints more than allowed."""

    def __init__(
        self,
        pid: int,
        stdin_fd: int,
        out_fd: int,
        err_fd: int,
        stdin: bytes,
        output_bytes: int,
        stderr_kept: int,
    ) -> None:
        self.pidfd = os.pidfd_open(pid)
        self.stdin_fd, self.out_fd, self.err_fd = stdin_fd, out_fd, err_fd
        self.pending = memoryview(stdin)
        self.output_bytes, self.stderr_kept = output_bytes, stderr_kept
        self.stdout, self.stderr = bytearray(), bytearray()
        self.stderr_seen = 0
        self.timed_out = self.exceeded = False

    def pump(self, deadline: float) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.pidfd, selectors.EVENT_READ, "exit")
        for fd in (self.out_fd, self.err_fd):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, "read")
        os.set_blocking(self.stdin_fd, False)
        if self.pending:
            sel.register(self.stdin_fd, selectors.EVENT_WRITE, "write")
        else:
            os.close(self.stdin_fd)
        exited = False
        while not (exited or self.timed_out or self.exceeded):
            left = deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                break
            for key, _ in sel.select(left):
                if key.data == "exit":
                    exited = True
                elif key.data == "write":
                    self.feed(sel)
                elif not self.read(key.fd):
                    sel.unregister(key.fd)
        sel.close()
        if self.pending:
            os.close(self.stdin_fd)

    def feed(self, sel: selectors.BaseSelector) -> None:
        try:
            sent = os.write(self.stdin_fd, self.pending[:CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:  # the program stopped reading: what it did not read is dropped
            sent = len(self.pending)
        self.pending = self.pending[sent:]
        if not self.pending:
            sel.unregister(self.stdin_fd)
            os.close(self.stdin_fd)

    def read(self, fd: int) -> bool:
        """One read of `fd`; False at its end (or when nothing more is there to read)."""
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            return False
        if fd == self.err_fd:  # its tail is kept: that is where a traceback ends
            self.stderr_seen += len(chunk)
            self.stderr += chunk
            del self.stderr[: -self.stderr_kept]
            self.exceeded = self.stderr_seen > self.output_bytes
            return True
        room = self.output_bytes - len(self.stdout)
        self.stdout += chunk[: max(room, 0)]
        self.exceeded = len(chunk) > room
        return True

    def drain(self) -> None:
        """What the program wrote before it ended and was not read yet; then close."""
        for fd in (self.out_fd, self.err_fd):
            while not self.exceeded and self.read(fd):
                pass
            os.close(fd)
        os.close(self.pidfd)


def kill_all(pid: int) -> None:
    """Every process of the job: in a namespace, every process but this one; otherwise the
    program's process group (a process that left it survives: the plain mode says so)."""
    try:
        if NAMESPACE:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def reap_rest() -> None:
    """In a namespace this process is every orphan's parent: wait for all of them, so none is
    alive (or a zombie) when the next program starts."""
    if not NAMESPACE:
        return
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def clean(home: str) -> None:
    """Empty every place the program could write (the folder its job's folder is in, and in a
    namespace /tmp and /dev/shm); in a namespace, remove its IPC objects."""
    for place in [home] + (["/tmp", "/dev/shm"] if NAMESPACE else []):
        for root, dirs, _ in os.walk(place):
            for name in dirs:  # a folder it made unreadable is still its own to open
                try:
                    os.chmod(os.path.join(root, name), 0o700)
                except OSError:
                    pass
        for name in os.listdir(place):
            path = os.path.join(place, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
    if NAMESPACE:
        remove_ipc()


def remove_ipc() -> None:
    for kind in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + kind) as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:  # the second column is the object's id
            ident = int(row.split()[1])
            if kind == "shm":
                LIBC.shmctl(ident, IPC_RMID, None)
            elif kind == "sem":
                LIBC.semctl(ident, 0, IPC_RMID)
            else:
                LIBC.msgctl(ident, IPC_RMID, None)


def main() -> None:
    # Not dumpable: a program of the same user cannot trace this process or read its memory.
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    job_in, job_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    serve(job_in, job_out, os.getcwd())


main()
