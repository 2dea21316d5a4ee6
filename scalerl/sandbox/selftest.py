"""A sandbox's guarantees tried, not assumed: a program is run in it that looks for what the
process around it holds, and says what it reached.

`reached(mode)` plants a canary where a pod keeps its secrets (the environment a process of
this user started with, where a tracker's key is; a file readable by this user, where a
ServiceAccount token is mounted) and listens on 127.0.0.1, then runs SEARCH in a sandbox of
`mode`. SEARCH looks in its own
environment, in every process's environment under /proc, in the file, and connects to the port;
it prints what it reached. In a full sandbox that is nothing; a plain process reaches the file
and the network. `check` is what `scalerl sandbox-check` runs where the code pods run.
"""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from scalerl.errors import SandboxUnavailable
from scalerl.sandbox.isolation import Isolation, required
from scalerl.sandbox.run import Limits, execute

# Reads the canary, the file's path and the port on stdin; prints the list of what it reached.
SEARCH = """
import glob, os, socket
canary, token, port = input(), input(), int(input())
found = []
if any(canary in value for value in os.environ.values()):
    found.append("its environment")
for path in glob.glob("/proc/*/environ"):
    try:
        with open(path, "rb") as file:
            if canary.encode() in file.read():
                found.append(path)
    except OSError:
        pass
try:
    with open(token) as file:
        if canary in file.read():
            found.append("a file of this user (" + token + ")")
except OSError:
    pass
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    found.append("the network (127.0.0.1)")
except OSError:
    pass
print(found)
"""
CANARY_VARIABLE = "SCALERL_SANDBOX_CANARY"
LIMITS = Limits(wall_seconds=30.0, cpu_seconds=10, memory_bytes=512 << 20, output_bytes=1 << 16)


def reached(mode: Isolation) -> list[str]:
    """What SEARCH reached from a sandbox of `mode` (see the module's text); raises
    RuntimeError where it did not run to its end."""
    canary = secrets.token_hex(16)
    # A process started with the canary in its environment, as a pod's process starts with its
    # secrets (/proc/PID/environ shows the environment a process was started with, not one set
    # later), alive while the program looks.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={**os.environ, CANARY_VARIABLE: canary},
    )
    try:
        with tempfile.TemporaryDirectory() as folder, socket.socket() as server:
            Path(folder).chmod(0o755)  # as a mounted token: its folder open, the file readable
            token = Path(folder) / "token"
            token.write_text(canary)
            token.chmod(0o644)
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            asked = f"{canary}\n{token}\n{port}\n".encode()
            done = execute(SEARCH, asked, LIMITS, mode=mode)
    finally:
        holder.communicate(timeout=30)  # its stdin closed: it ends
    if done.returncode != 0 or done.error:
        why = done.error or done.stderr.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"the sandbox's self-test did not run: {why}")
    found = ast.literal_eval(done.stdout.decode().strip())
    return [str(item) for item in found]


def check(allow_plain: bool = False) -> tuple[Isolation, list[str]]:
    """The sandbox this process can make (`isolation.required`) and what SEARCH reached from
    it. Raises SandboxUnavailable where none can be made, or where a sandbox let the program
    reach anything (a plain one, allowed by name, reaches what it reaches: said, not raised)."""
    mode = required(allow_plain)
    found = reached(mode)
    if found and mode.mode != "plain":
        raise SandboxUnavailable(
            f"the sandbox ({mode.mode}) let a program reach {', '.join(found)}"
        )
    return mode, found
