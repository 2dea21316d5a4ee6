"""How a sandboxed execution is isolated on this machine: bubblewrap with Linux namespaces where
the platform allows them, otherwise a plain process with resource limits — and which guarantees
that leaves out, said out loud rather than silently dropped.

Full isolation (`bwrap`, Debian's bubblewrap): a new user, PID, network, mount, IPC, UTS and
cgroup namespace; the sandbox sees only the system's /usr (read-only), its own working folder
(read-write) and a small private /tmp; no network interface but a loopback that is down; no
environment but PATH, HOME and LANG; no further user namespaces. When we run as root, the sandbox
runs as `nobody` (uid 65534) so the kernel enforces the process-count limit (it never does for
root) and the host's root-owned files stay out of reach even where a path is visible.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.errors import SandboxUnavailable

log = logging.getLogger(__name__)

# The guarantees an execution can have; `Isolation.missing` names those it lacks.
OWN_PROCESS_GROUP = "own process group"
RESOURCE_LIMITS = "wall, CPU, memory and output limits"
PROCESS_LIMIT = "process-count limit"
NO_NETWORK = "no network"
PRIVATE_FILESYSTEM = "private filesystem (no reads or writes outside its folder)"
NO_SURVIVORS = "nothing left running (its own PID namespace)"
NO_SIGNALS_OUT = "cannot signal processes outside it"
FRESH_MACHINE = (
    "a fresh machine per program (its own mount and IPC namespaces: nothing it writes, no IPC "
    "object it makes, reaches the next program)"
)
GUARANTEES = (
    OWN_PROCESS_GROUP,
    RESOURCE_LIMITS,
    PROCESS_LIMIT,
    NO_NETWORK,
    PRIVATE_FILESYSTEM,
    NO_SURVIVORS,
    NO_SIGNALS_OUT,
    FRESH_MACHINE,
)
NOBODY = 65534  # the user a root process runs sandboxes as
SANDBOX_DIR = "/sandbox"  # where the execution's own folder appears inside bubblewrap
TMP_BYTES = 16 << 20  # size of each place a sandbox may write: its folder, /tmp, /dev/shm


@dataclass(frozen=True)
class Isolation:
    """The isolation every execution of this process gets; `missing` lists what it lacks and
    `reason` says why (empty when nothing is missing)."""

    mode: str  # "bwrap" | "plain"
    missing: tuple[str, ...] = ()
    reason: str = ""
    # The sandbox mounts a /proc of its own. Where a container's /proc is masked (a restricted
    # pod) the kernel refuses it one: its programs then see no /proc at all, and its first
    # process adds a program's processes up in the /proc of the process that started it.
    proc: bool = True

    @property
    def full(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        """One line: the mode, what it lacks and why (the mode alone when it lacks nothing)."""
        if self.missing:
            return f"{self.mode}; without: {', '.join(self.missing)} ({self.reason})"
        if not self.proc:
            return f"{self.mode}; its programs see no /proc ({self.reason})"
        return self.mode

    @property
    def fresh(self) -> bool:
        """Each program gets its own mount and IPC namespaces (bubblewrap gave the sandbox's
        first process CAP_SYS_ADMIN in the sandbox's own user namespace)."""
        return self.mode == "bwrap" and FRESH_MACHINE not in self.missing


def run_as() -> int | None:
    """The uid sandboxes run as: nobody when we are root, else our own (None: no change)."""
    return NOBODY if os.geteuid() == 0 else None


def as_sandbox_user() -> dict[str, Any]:
    """subprocess.Popen's arguments that start a child as the sandbox's user (nobody, with no
    supplementary groups, when we are root; nothing otherwise). Popen changes the ids itself
    between fork and exec, safe in a process with threads, unlike a preexec_fn."""
    uid = run_as()
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def interpreter() -> str:
    """The Python that runs sandboxed programs: the system's /usr/bin/python3 where there is
    one (readable by nobody and inside the /usr the sandbox sees), else ours."""
    system = Path("/usr/bin/python3")
    return str(system) if system.exists() else str(Path(sys.executable).resolve())


def bwrap_argv(python: str, fresh: bool = True, proc: bool = True) -> list[str]:
    """The bubblewrap command line (without the command) that runs `python` in a sandbox. With
    `fresh`, its first process keeps CAP_SYS_ADMIN in the sandbox's user namespace (and only
    there), to give each program mounts and an IPC namespace of its own; the programs drop it.
    Without `proc`, the sandbox has no /proc (where the kernel refuses it one: a masked /proc),
    nor bubblewrap's --disable-userns, which writes a limit there: the supervisor's seccomp
    filter refuses programs new namespaces in every mode."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        *(["--disable-userns"] if proc else []),
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", SANDBOX_DIR,
        "--setenv", "LANG", "C.UTF-8",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    if fresh:
        argv += ["--cap-add", "CAP_SYS_ADMIN"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/") / link
        if target.is_symlink():
            argv += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            argv += ["--ro-bind", str(target), str(target)]
    prefix = Path(python).resolve().parent.parent
    if not prefix.is_relative_to("/usr"):
        argv += ["--ro-bind", str(prefix), str(prefix)]
    # Every place it may write is a small tmpfs, so a program cannot fill the host's disk: the
    # sandbox's folder (where each program's own folder is made), /tmp and /dev/shm; the rest of
    # /dev is read-only.
    if proc:
        argv += ["--proc", "/proc"]
    argv += [
        "--dev", "/dev",
        "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
        "--size", str(TMP_BYTES), "--tmpfs", SANDBOX_DIR,
    ]  # fmt: skip
    return [*argv, "--chdir", SANDBOX_DIR, "--remount-ro", "/"]


@functools.cache
def probe() -> Isolation:
    """What this machine allows, found once by starting one empty sandbox; logged when it is
    less than full isolation."""
    isolation = _probe()
    if not isolation.full:
        log.warning("code sandbox without %s: %s", ", ".join(isolation.missing), isolation.reason)
    return isolation


# What to do where no sandbox can be made: said with every refusal.
FIXES = (
    "install bubblewrap (apt-get install bubblewrap) and allow unprivileged user namespaces; on "
    "a cluster, give the pods that score code a seccomp profile that allows user namespaces "
    "(the container runtime's default, or a Localhost profile) or run them under a sandboxed "
    "runtime class (docs/cluster.md, 'Model-written code'); or, knowing it "
    "runs model-written code unsandboxed, set spec.data.code.unsafeAllowPlain: true"
)


def required(allow_plain: bool = False) -> Isolation:
    """The isolation programs get here (`probe`), where a sandbox can be made; plain processes
    only when the caller allows them by name (a spec's `data.code.unsafeAllowPlain`). Raises
    SandboxUnavailable, saying why and what to change, otherwise: model-written code never runs
    unsandboxed because a machine silently refused the sandbox (audit F16)."""
    found = probe()
    if found.mode == "plain" and not allow_plain:
        raise SandboxUnavailable(f"no sandbox for model-written code: {found.reason}. {FIXES}")
    return found


def plain(reason: str) -> Isolation:
    """A plain process group with resource limits: what holds where namespaces are refused."""
    # No network holds here too: the supervisor's seccomp filter refuses programs every socket
    # but a Unix one.
    missing = (PRIVATE_FILESYSTEM, NO_SURVIVORS, NO_SIGNALS_OUT, FRESH_MACHINE)
    return Isolation("plain", missing, reason)


# What the probe runs inside: a mount of its own, as each program's process makes one.
_PROBE = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "assert libc.unshare(0x00020000 | 0x08000000) == 0, ctypes.get_errno()\n"
    "assert libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, b'size=4096') == 0, ctypes.get_errno()\n"
)


def _probe() -> Isolation:
    if shutil.which("bwrap") is None:
        return plain("bubblewrap (bwrap) is not installed")
    try:
        refused = _try(fresh=True)
        if not refused:
            return Isolation("bwrap")
        first = refused
        if "mount proc" in refused:
            # A container's /proc has paths masked (over-mounted) by its runtime, and the kernel
            # refuses a new /proc where one would reveal them (a restricted pod's procMount:
            # Default). The sandbox goes without: its programs then see no process at all.
            refused = _try(fresh=True, proc=False)
            if not refused:
                why = (
                    f"bubblewrap refused a /proc of its own ({first}): this /proc is masked, as "
                    "a container's is unless its pod asks for procMount: Unmasked; its programs "
                    "see no /proc"
                )
                log.info("code sandbox without a /proc: %s", why)
                return Isolation("bwrap", (), why, proc=False)
            return plain(f"bubblewrap refused ({first}; without a /proc: {refused})")
        refused = _try(fresh=False)
        if not refused:
            why = f"bubblewrap refused a capability in its own namespace ({first})"
            return Isolation("bwrap", (FRESH_MACHINE,), why)
    except (OSError, subprocess.TimeoutExpired) as err:
        return plain(f"bubblewrap could not start: {err}")
    return plain(f"bubblewrap refused ({first}; then {refused}); user namespaces may be disabled")


def _try(fresh: bool, proc: bool = True) -> str:
    """Start one empty sandbox of this kind: '' when it ran, else what bubblewrap said."""
    python = interpreter()
    done = subprocess.run(
        [*bwrap_argv(python, fresh, proc), python, "-I", "-c", _PROBE if fresh else "pass"],
        capture_output=True,
        timeout=30,
        check=False,
        cwd="/",
        **as_sandbox_user(),
    )
    if done.returncode == 0:
        return ""
    return done.stderr.decode(errors="replace").strip()[-300:] or f"exit {done.returncode}"
