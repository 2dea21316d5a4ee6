"""What the operator does for a run, level-triggered and restart-safe; kopf-free.

Phases: Pending (no gang: a spec the operator cannot run yet) -> [Initializing ->] [Queued ->]
Starting (a gang created; until every pod of it runs) -> Running -> Succeeded | Failed, and
Suspended while `spec.suspend` is true.

Initializing is a run with hf:// sources waiting for its initializer Job (initializer.py) to
download them into the claim; its gang is created (and a queued one submitted to Kueue) only
once status.sources records every one, so no pod, GPU or queue quota waits on a download. A
failed download leaves it there, the message saying why, until the spec changes or the Job is
deleted (a new one starts).

Queued is a queued run's wait for Kueue (`spec.scheduling.queueName`): its gang is one suspended
JobSet, one Kueue workload, until Kueue admits every pod of it at once; PodsReady=False says what
Kueue says (no quota, no such queue). Time in the queue is no startup: the startup timeout counts
from admission. A gang Kueue evicts (preemption) is Queued again until readmitted.

Starting is the wait for a shared cluster: the scheduler, an autoscaler, image pulls. While it
lasts the PodsReady condition says why pods wait (the scheduler's message, an image that cannot
be pulled, ...), a gang that fails restarts without using up `failurePolicy.maxRestarts`, and
`failurePolicy.startupTimeoutSeconds`, counted from the first gang since the run last ran, ends it
Failed with that reason.

Succeeded means trainer 0 exited 0: it reached the budget (its own last evaluation and checkpoint
written). Every earlier end is Failed with a reason, as Kubernetes Jobs end Failed on
`activeDeadlineSeconds`: a gang that failed more often than `failurePolicy.maxRestarts`, a start
past its timeout, or a run stopped by `budget.stopWhen` because the forecast's interval at the
budget of a checked fit (confidence OK) lies below the threshold (`scalerl.fit.decision.
stop_reason`; Stopped=True says so).
Automation that promotes Succeeded checkpoints must not promote those.

Each status change is a guarded transition: read, check the guard, write with a resourceVersion
precondition. Two handlers racing on one run (or an operator restarting half-way) cannot restart
a gang twice or resurrect a finished run. Events are posted only for transitions that happened.
"""

from __future__ import annotations

from scalerl.operator.lifecycle.fit import fitted, on_status, wants_action
from scalerl.operator.lifecycle.gang import job_failure, job_suspended, on_pod, on_workload_job
from scalerl.operator.lifecycle.givenup import end_given_up, given_up
from scalerl.operator.lifecycle.run import cleanup, reconcile
from scalerl.operator.lifecycle.state import TERMINAL, Context, owner_of

__all__ = [
    "TERMINAL",
    "Context",
    "cleanup",
    "end_given_up",
    "fitted",
    "given_up",
    "job_failure",
    "job_suspended",
    "on_pod",
    "on_status",
    "on_workload_job",
    "owner_of",
    "reconcile",
    "wants_action",
]
