"""Runs untrusted programs (a model's code, for `reward: code`) so they cannot touch anything
else, nor each other: `Sandbox().run(program, stdin, limits)` -> `Execution`, one program after
another in one sandbox; `execute(...)`, one in a sandbox of its own.

Each execution gets its own process group and session; a wall-clock limit (killed from outside
it), CPU, address-space, file-size and process-count limits (kernel rlimits, set inside its user
namespace so the process count is its own) and CPU and memory limits on all its processes
together; bounded stdout/stderr (killed past the limit); and, with bubblewrap
(`scalerl.sandbox.isolation`), its own user, PID, network, mount and IPC namespaces: no network,
a read-only view of /usr and nothing else of the machine, and a fresh machine per program (new
small tmpfs mounts wherever it may write, its own IPC namespace, no keyring, no namespace of its
own making). Where a container's /proc is masked, the sandbox has no /proc and its limits are
added up in the /proc outside it (`Isolation.proc`). Its stdin, stdout
and stderr never pass through the process that programs are forked from. After each program
every process it started is killed (scalerl/sandbox/supervisor.py).

`Execution.error` is a failure no program could cause (the program never ran: unscored);
`Execution.damaged` is what a program did to its sandbox (its failure; the next program gets a
new sandbox). Where the platform refuses user namespaces (a pod whose seccomp profile forbids
them), a sandbox is refused with SandboxUnavailable (`isolation.required`) unless the caller
passes a plain Isolation by name (a spec's `data.code.unsafeAllowPlain`): executions then run
as plain processes with the limits that still hold, and `Isolation.missing` — in every
`Execution` and logged once — names what is lost. What the
sandbox does not protect against: kernel bugs (the namespaces share the machine's kernel; a
gVisor runtime class closes that on a cluster), CPU and memory-bandwidth contention with the
generator (the pool bounds how many run at once), and a program reading what the system's /usr
holds.
"""

from scalerl.sandbox.isolation import Isolation, probe, required
from scalerl.sandbox.run import Execution, Limits, PerThread, Sandbox, execute

__all__ = [
    "Execution",
    "Isolation",
    "Limits",
    "PerThread",
    "Sandbox",
    "execute",
    "probe",
    "required",
]
