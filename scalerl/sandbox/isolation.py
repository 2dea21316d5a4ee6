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

log = logging.getLogger(__name__)

# The guarantees an execution can have; `Isolation.missing` names those it lacks.
OWN_PROCESS_GROUP = "own process group"
RESOURCE_LIMITS = "wall, CPU, memory and output limits"
PROCESS_LIMIT = "process-count limit"
NO_NETWORK = "no network"
PRIVATE_FILESYSTEM = "private filesystem (no reads or writes outside its folder)"
NO_SURVIVORS = "nothing left running (its own PID namespace)"
NO_SIGNALS_OUT = "cannot signal processes outside it"
GUARANTEES = (
    OWN_PROCESS_GROUP,
    RESOURCE_LIMITS,
    PROCESS_LIMIT,
    NO_NETWORK,
    PRIVATE_FILESYSTEM,
    NO_SURVIVORS,
    NO_SIGNALS_OUT,
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

    @property
    def full(self) -> bool:
        return not self.missing


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


def bwrap_argv(python: str) -> list[str]:
    """The bubblewrap command line (without the command) that runs `python` in a sandbox."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", SANDBOX_DIR,
        "--setenv", "LANG", "C.UTF-8",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
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
    argv += [
        "--proc", "/proc",
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


def plain(reason: str) -> Isolation:
    """A plain process group with resource limits: what holds where namespaces are refused."""
    missing = (NO_NETWORK, PRIVATE_FILESYSTEM, NO_SURVIVORS, NO_SIGNALS_OUT)
    return Isolation("plain", missing, reason)


def _probe() -> Isolation:
    if shutil.which("bwrap") is None:
        return plain("bubblewrap (bwrap) is not installed")
    try:
        done = subprocess.run(
            [*bwrap_argv(interpreter()), interpreter(), "-I", "-c", "pass"],
            capture_output=True,
            timeout=30,
            check=False,
            cwd="/",
            **as_sandbox_user(),
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return plain(f"bubblewrap could not start: {err}")
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        return plain(f"bubblewrap refused ({why}); user namespaces may be disabled here")
    return Isolation("bwrap")
