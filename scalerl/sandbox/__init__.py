"""Runs untrusted programs (a model's code, for `reward: code`) so they cannot touch anything
else: `execute(program, stdin, limits)` -> `Execution`.

Each execution gets its own process group and session; a wall-clock limit (killed from outside),
CPU, address-space, file-size and process-count limits (kernel rlimits, set inside its user
namespace so the process count is its own); bounded stdout/stderr (killed past the limit); a
private working folder, removed after; and, with bubblewrap (`scalerl.sandbox.isolation`), its own
user, PID, network, mount and IPC namespaces: no network, a read-only view of /usr and nothing else
of the machine, and every process it started killed with its PID namespace.

Where the platform refuses user namespaces (a pod whose seccomp profile forbids them), executions
run as plain processes with the limits that still hold, and `Isolation.missing` — in every
`Execution` and logged once — names what is lost. What the sandbox does not protect against:
kernel bugs (the namespaces share the machine's kernel; a gVisor runtime class closes that on a
cluster), CPU and memory-bandwidth contention with the generator (the pool bounds how many run at
once), and a program reading what the system's /usr holds.
"""

from scalerl.sandbox.isolation import Isolation, probe
from scalerl.sandbox.run import Execution, Limits, execute

__all__ = ["Execution", "Isolation", "Limits", "execute", "probe"]
