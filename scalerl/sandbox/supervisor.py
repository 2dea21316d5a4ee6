"""The first process of a sandbox: it starts the programs it is sent, one at a time, each in a
forked child under its own limits, and leaves nothing of one program for the next.

Started by scalerl.sandbox.run as `python -I -c <this file's text> MODE [PROC]`:

- "fresh": the first process of its own user, PID, mount and IPC namespaces (bubblewrap's
  `--as-pid-1`), holding CAP_SYS_ADMIN in that user namespace only. Each program's child makes
  a mount and an IPC namespace of its own with new small tmpfs mounts (its folder, /tmp,
  /dev/shm; bounded in bytes and in inodes), then drops every capability before the program
  runs: what a program writes, and its System V and POSIX IPC objects, die with it, whatever
  their number or depth.
- "namespace": the same without the capability (where bubblewrap refuses `--cap-add`): the
  places a program may write are shared by the sandbox's programs and emptied after each one.
- "plain": an ordinary process, where namespaces are refused.

PROC says where this process reads a program's processes, to add up their CPU and memory:
"proc", the sandbox's own /proc (every process but this one); "outer-proc=N", where the sandbox
has no /proc (a container's masked /proc refuses it one), the /proc of the process that started
it, open on descriptor N (the processes that descend from this one). No program inherits it.

Nothing of a program's data passes through this process. The program's stdin, stdout and
stderr are pipes scalerl.sandbox.run made and feeds or reads itself; its files come in a memfd;
all arrive here as descriptors passed over a Unix socket (SCM_RIGHTS) and are handed to the
child unread. So a child, a copy of this process, carries no earlier program's input, output or
source in its memory. A seccomp filter refuses programs the keyrings (add_key, request_key,
keyctl: a user's keyring outlives its processes) and new namespaces (clone and unshare with a
namespace flag, setns; clone3, whose flags a filter cannot read, says ENOSYS and the C library
falls back to clone): a program gets no capability back in a user namespace of its own. It
refuses every socket but a Unix one, and io_uring (whose requests no filter sees): no network,
in plain mode too.

This process is out of the programs' reach: it resets SIGINT (which Python handles) to the
default, so as a namespace's first process it takes no signal at all from inside; it is not
dumpable, so a program of the same user can neither trace it nor read its memory; and whatever
a program leaves is killed (`kill(-1)` from the first process reaches every other) and reaped
before the next starts. A failure while a program runs (this process gone, a clean that did
not finish) is reported as that program's; a failure before it runs (fork or setup refused,
the host out of memory) as "unscored": no program could have caused it.

Protocol, on fd 0 (a SOCK_SEQPACKET socket): this process sends `ready`. A job is one message,
a JSON header {"main": name, "limits": [memory, files, processes, cpu, wall], "setup": seconds}
with four descriptors (stdin to read, stdout and stderr to write, the files' memfd: JSON {name:
text}). Once the program's child is set up this process sends `started`: the wall clock runs
from there (its setup, waiting on a busy host's mount locks, is no program's time; it has
"setup" seconds, else the job is unscored). While it runs, a message `kill` ends it (its output
went past the limit). Its result is one message: JSON {"returncode": int (minus the signal that
ended it), "timed_out", "cpu_exceeded", "memory_exceeded": bool, "unscored": why it never ran
(""), "damaged": why the sandbox is no longer sound ("")}. Not imported by scalerl; standard
library only, any Python 3.9+.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Any, NoReturn

MODE = sys.argv[1]  # "fresh" | "namespace" | "plain"
NAMESPACE = MODE != "plain"  # the first process of a PID namespace
FRESH = MODE == "fresh"
PROC = sys.argv[2] if len(sys.argv) > 2 else ""
# The /proc of the process that started the sandbox, where it has none of its own.
OUTER = int(PROC.split("=", 1)[1]) if PROC.startswith("outer-proc=") else None
# This process's pid there (read once: every look at a program's processes starts from it).
OUTER_PID = int(os.readlink("self", dir_fd=OUTER)) if OUTER is not None else 0
SANDBOX_DIR = "/sandbox"
TMP_BYTES = 16 << 20  # each place a program may write
TMP_INODES = 4096  # files and folders in each (fresh mode): a flood ends here, not in a slow clean
CLEAN_SECONDS = 5.0  # a shared place (namespace and plain modes) not emptied by then is unsound
LOOK_SECONDS = 0.1  # how often a running program's processes are added up (CPU, memory)
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
IPC_RMID = 0
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL(None, use_errno=True)  # the C library this interpreter runs on


# --- the child: one program -------------------------------------------------------------------


def limit(which: int, value: int) -> None:
    if value > 0:
        resource.setrlimit(which, (value, value))


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def fresh_places(folder: str) -> None:
    """A mount and IPC namespace of the child's own, with a new tmpfs wherever it may write."""
    check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    options = f"size={TMP_BYTES},nr_inodes={TMP_INODES},mode=0700".encode()
    for place in (SANDBOX_DIR, "/tmp", "/dev/shm"):
        check(LIBC.mount(b"tmpfs", place.encode(), b"tmpfs", 0, options), f"mount {place}")
    os.mkdir(folder, 0o700)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


# Per architecture (its audit number): the calls refused (add_key, request_key, keyctl, setns,
# io_uring_setup: its requests pass no filter), those refused when they ask for a new namespace
# (clone, unshare), socket (refused but for AF_UNIX), and clone3. x32's numbers (bit 30 set on
# x86-64) are refused whole.
CALLS = {
    0xC000003E: ((248, 249, 250, 308, 425), (56, 272), 41, 435),  # x86-64
    0xC00000B7: ((217, 218, 219, 268, 425), (220, 97), 198, 435),  # aarch64
}
AF_UNIX = 1
X32_BIT = 0x40000000
NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|K forms, RET|K
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low word of args[0])


def syscall_filter() -> list[tuple[int, int, int, int]]:
    """A classic BPF program (see CALLS): EPERM for the refused calls, for clone or unshare with
    a namespace flag and for a socket that is not AF_UNIX (no network, even in plain mode);
    ENOSYS for clone3; everything else allowed."""
    program: list[tuple[int, int | str, int | str, int] | str] = [(LD, 0, 0, ARCH)]
    for n, (arch, (refused, namespaced, socket_, clone3)) in enumerate(CALLS.items()):
        program += [(JEQ, 0, f"arch{n + 1}", arch), (LD, 0, 0, NR)]
        if arch == 0xC000003E:
            program.append((JGE, "eperm", 0, X32_BIT))
        program += [(JEQ, "eperm", 0, nr) for nr in refused]
        program += [(JEQ, f"flags{n}", 0, nr) for nr in namespaced]
        program += [(JEQ, f"socket{n}", 0, socket_), (JEQ, "enosys", 0, clone3)]
        program += [(RET, 0, 0, ALLOW), f"flags{n}", (LD, 0, 0, ARG0)]
        program += [(JSET, "eperm", 0, NEW_NAMESPACES), (RET, 0, 0, ALLOW), f"socket{n}"]
        program += [(LD, 0, 0, ARG0), (JEQ, 0, "eperm", AF_UNIX), (RET, 0, 0, ALLOW)]
        program += [f"arch{n + 1}"]
    program += [(RET, 0, 0, ALLOW), "eperm", (RET, 0, 0, EPERM), "enosys", (RET, 0, 0, ENOSYS)]
    return assemble(program)


def assemble(
    program: list[tuple[int, int | str, int | str, int] | str],
) -> list[tuple[int, int, int, int]]:
    """Resolve the labels (strings) in `program`: a jump to one lands on the instruction that
    follows it (BPF jumps only forward)."""
    at, count = {}, 0
    for item in program:
        if isinstance(item, str):
            at[item] = count
        else:
            count += 1
    code: list[tuple[int, int, int, int]] = []
    for item in program:
        if isinstance(item, str):
            continue
        op, true, false, k = item
        here = len(code)
        jump = [at[t] - here - 1 if isinstance(t, str) else t for t in (true, false)]
        code.append((op, jump[0], jump[1], k))
    return code


def confine() -> None:
    """No capability, no new privileges on exec, no keyring, no new namespace, no network."""
    check(LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient caps")
    header = CapHeader(0x20080522, 0)
    data = (CapData * 2)()
    check(LIBC.capset(ctypes.byref(header), data), "capset")
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    rules = syscall_filter()
    table = (SockFilter * len(rules))(*[SockFilter(*r) for r in rules])
    prog = SockFprog(len(rules), table)
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def run_program(folder: str, job: dict[str, Any], fds: list[int], status: int) -> NoReturn:
    """In the forked child: set up (reporting a failure there on `status`, which makes the job
    unscored), say "ok" on `status` and close it, then run the program as `__main__`, as `python
    main.py` would. Never returns."""
    try:
        stdin_fd, out_fd, err_fd, files_fd = fds
        memory, files, processes, cpu = job["limits"][:4]
        os.setsid()
        if FRESH:
            fresh_places(folder)
        else:
            os.mkdir(folder, 0o700)
        for name, text in json.loads(read_all(files_fd)).items():
            with open(os.path.join(folder, name), "w") as file:
                file.write(text)
        os.chdir(folder)
        for fd, target in ((stdin_fd, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
        os.closerange(3, status)
        os.closerange(status + 1, 1 << 16)
        # Soft and hard alike: past the CPU limit the kernel kills (SIGXCPU, then SIGKILL).
        limit(resource.RLIMIT_CPU, cpu)
        limit(resource.RLIMIT_AS, memory)
        limit(resource.RLIMIT_FSIZE, files)
        limit(resource.RLIMIT_NPROC, processes)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        confine()
        LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # an ordinary process (this one is not dumpable)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in any Python
    except BaseException as err:  # noqa: BLE001 — said on `status`: the job was never run
        os.write(status, f"setup failed: {type(err).__name__}: {err}".encode()[:500])
        os._exit(127)
    os.write(status, b"ok")
    os.close(status)  # from here on, the program's: it cannot un-say "ok"
    main = job["main"]
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
        code_ = 0
    except SystemExit as stop:
        code_ = exit_status(stop.code)
    except BaseException:  # what `python main.py` does with an uncaught exception
        traceback.print_exc()
        code_ = 1
    os._exit(finish(code_))


def read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    parts = []
    while part := os.read(fd, 1 << 20):
        parts.append(part)
    os.close(fd)
    return b"".join(parts)


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


def serve(control: socket.socket, home: str) -> None:
    control.sendall(b"ready")
    number = 0
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
        except OSError:
            return
        if not message:
            return  # the other end closed: the sandbox is being ended
        if len(fds) != 4:  # a `kill` for a job that already ended
            for fd in fds:
                os.close(fd)
            continue
        number += 1
        folder = os.path.join(home, f"job-{number}-{os.urandom(4).hex()}")
        result = run_job(control, folder, json.loads(message), fds)
        result["damaged"] = result.get("damaged") or clean(home)
        control.sendall(json.dumps(result).encode())
        if result["damaged"]:
            return  # unsound from here on: the next program gets a new sandbox


def run_job(
    control: socket.socket, folder: str, job: dict[str, Any], fds: list[int]
) -> dict[str, Any]:
    status_r, status_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as err:
        for fd in (*fds, status_r, status_w):
            os.close(fd)
        return {"unscored": f"could not start the program: {err}"}
    if pid == 0:
        os.close(status_r)
        control.close()
        run_program(folder, job, fds, status_w)
    for fd in (*fds, status_w):
        os.close(fd)
    result, said = watch(control, pid, status_r, job)
    kill_all(pid)
    status = os.waitpid(pid, 0)[1]
    reap_rest()
    said += read_status(status_r)
    if said != b"ok":
        ended = f"the program's setup did not finish within {job['setup']:g} s"
        return {"unscored": said.decode(errors="replace") or ended}
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"returncode": code, **result}


def read_status(fd: int) -> bytes:
    parts = []
    while part := os.read(fd, 4096):
        parts.append(part)
    os.close(fd)
    return b"".join(parts)


def watch(
    control: socket.socket, pid: int, status: int, job: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """Wait until the program's first process ends, the wall clock (from the end of its setup)
    runs out, its processes together pass the CPU or memory limit, or a `kill` comes (its output
    went past the limit). Also what its setup said on `status` so far."""
    memory, cpu, wall = job["limits"][0], job["limits"][3], job["limits"][4]
    result = {"timed_out": False, "cpu_exceeded": False, "memory_exceeded": False}
    said = b""
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    sel.register(control, selectors.EVENT_READ, "control")
    sel.register(status, selectors.EVENT_READ, "setup")
    deadline = time.monotonic() + job["setup"]
    look = time.monotonic() + LOOK_SECONDS
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                result["timed_out"] = said == b"ok"
                return result, said
            events = sel.select(min(deadline, look) - now)
            if any(key.data == "setup" for key, _ in events):
                sel.unregister(status)
                said = os.read(status, 4096)
                if said == b"ok":  # the program runs from here
                    deadline = time.monotonic() + wall
                    control.sendall(b"started")
            if any(key.data == "exit" for key, _ in events):
                return result, said
            if any(key.data == "control" for key, _ in events):
                message, fds, _, _ = socket.recv_fds(control, 64, 4)
                for fd in fds:
                    os.close(fd)
                if not message:
                    kill_all(pid)
                    sys.exit(0)  # the other end is gone: so is the sandbox
                return result, said  # `kill`
            if time.monotonic() >= look and NAMESPACE and PROC:
                used, resident = totals()
                if cpu > 0 and used > cpu:
                    result["cpu_exceeded"] = True
                    return result, said
                if memory > 0 and resident > memory:
                    result["memory_exceeded"] = True
                    return result, said
                look = time.monotonic() + LOOK_SECONDS
    finally:
        sel.close()
        os.close(pidfd)


STAT = bytearray(4096)  # /proc/PID/stat is read into this, and wiped after


def totals() -> tuple[float, int]:
    """CPU seconds and resident bytes of every process of the sandbox but this one. A process
    reaped by another is in its reaper's children's time; none is reaped by this one while a
    program runs, so nothing is missed."""
    stats = read_stats()
    if OUTER is None:  # the sandbox's own /proc: its PID namespace, where this process is 1
        mine = [pid for pid in stats if pid != 1]
    else:
        mine = descendants(stats, OUTER_PID)
    return sum(stats[p][1] for p in mine), sum(stats[p][2] for p in mine)


def read_stats() -> dict[int, tuple[int, float, int]]:
    """Each process's parent, CPU seconds and resident bytes, from its stat line. The process's
    name (in the line, and the program's to set) is wiped from the buffer and never copied: no
    program's bytes stay in this process's memory for the next program's fork to find."""
    stats = {}
    for name in os.listdir("/proc" if OUTER is None else OUTER):
        if not name.isdigit():
            continue
        try:
            if OUTER is None:
                fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            else:
                fd = os.open(f"{name}/stat", os.O_RDONLY, dir_fd=OUTER)
        except OSError:
            continue
        try:
            size = os.readv(fd, [STAT])
            end = STAT.rfind(b")", 0, size)
            fields = bytes(STAT[end + 1 : size]).split()
            seconds = sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime
            stats[int(name)] = (int(fields[1]), seconds, int(fields[21]) * PAGE)
        except (OSError, ValueError, IndexError):
            pass
        finally:
            os.close(fd)
            STAT[:] = bytes(len(STAT))
    return stats


def descendants(stats: dict[int, tuple[int, float, int]], root: int) -> list[int]:
    """The processes below `root` (orphans of the namespace are its children: it is their
    reaper)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        below = [child for pid in frontier for child in children.get(pid, [])]
        found += below
        frontier = below
    return found


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


def clean(home: str) -> str:
    """Empty every place programs share (in fresh mode there is none: each had its own). Done
    in a child, with a deadline: a flood of files or a deep tree costs at most CLEAN_SECONDS and
    then says the sandbox is unsound. '' when it is clean, else why not."""
    if FRESH:
        return ""
    places = [home] + (["/tmp", "/dev/shm"] if NAMESPACE else [])
    pid = os.fork()
    if pid == 0:
        try:
            for place in places:
                wipe(place)
            if NAMESPACE:
                remove_ipc()
        except BaseException:  # noqa: BLE001 — said by the exit status
            os._exit(1)
        os._exit(0)
    pidfd = os.pidfd_open(pid)
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        done = bool(sel.select(CLEAN_SECONDS))
    os.close(pidfd)
    if not done:
        os.kill(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    if not done:
        return f"emptying what the program wrote took over {CLEAN_SECONDS:.0f} s"
    if status != 0:
        return "what the program wrote could not be removed"
    return ""


def wipe(place: str) -> None:
    """Remove everything under `place`, without recursion (a tree may be any depth) and by
    names relative to the current folder (its paths may be longer than the system allows)."""
    os.chdir(place)
    trail: list[str] = []
    while True:
        below = None
        with os.scandir(".") as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    below = entry.name
                    break
                os.unlink(entry.name)
        if below is not None:
            os.chmod(below, 0o700)  # a folder it made unreadable is still its own to open
            os.chdir(below)
            trail.append(below)
            continue
        if not trail:
            return
        os.chdir("..")
        os.rmdir(trail.pop())


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
    # Python handles SIGINT; the first process of a namespace takes from inside only the
    # signals it handles. With the default back, none reaches it (os.kill(1, SIGINT) did).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    serve(control, os.getcwd())


main()
