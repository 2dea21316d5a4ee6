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

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from scalerl.errors import SpecError
from scalerl.kube import Kube, KubeError
from scalerl.operator import children, initializer, names, sources, trackrecord
from scalerl.operator.manifests import Images, NetworkSettings, Owner
from scalerl.operator.schema import PHASES
from scalerl.spec import ScaleRLRun, parse_run
from scalerl.status.conditions import now_rfc3339, set_condition
from scalerl.status.kubernetes import RunStatus

PENDING, INITIALIZING, QUEUED, STARTING, RUNNING, SUSPENDED, SUCCEEDED, FAILED = PHASES
LIVE = (None, PENDING, QUEUED, STARTING, RUNNING)  # phases a gang failure or a stop applies to
# A container waiting for one of these is being started; any other reason is what holds it.
CREATING = (None, "ContainerCreating", "PodInitializing")
TERMINAL = (SUCCEEDED, FAILED)
NORMAL, WARNING = "Normal", "Warning"
RECREATE_WAIT_S = 10.0

# (run object, event type, reason, message)
Emit = Callable[[dict[str, Any], str, str, str], None]
ConditionArgs = tuple[str, bool, str, str]
Guard = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Context:
    kube: Kube
    images: Images
    owner: Owner
    emit: Emit
    network: NetworkSettings = NetworkSettings()

    @property
    def status(self) -> RunStatus:
        return RunStatus(self.kube, self.owner.namespace, self.owner.name)

    def bound(self, run_obj: dict[str, Any]) -> Context:
        """This context with the owner (uid included) of a fresh read of the run."""
        return replace(self, owner=owner_of(run_obj))

    def read(self) -> dict[str, Any] | None:
        try:
            return self.status.read()
        except KubeError as err:
            if err.status == 404:
                return None
            raise


def owner_of(run: dict[str, Any]) -> Owner:
    meta = run["metadata"]
    return Owner(meta["name"], meta["namespace"], meta["uid"])


def parse(run: dict[str, Any]) -> tuple[ScaleRLRun | None, list[str]]:
    """The parsed run, or the problems (one line per bad field) that stop it."""
    try:
        parsed = parse_run(run)
    except SpecError as err:
        return None, err.problems
    problems = names.name_problems(parsed.name, queued=parsed.queue_name is not None)
    return (None, problems) if problems else (parsed, [])


def status_of(run: dict[str, Any]) -> dict[str, Any]:
    status = run.get("status")
    return status if isinstance(status, dict) else {}


def transition(
    status: RunStatus,
    guard: Guard,
    *,
    phase: str | None = None,
    message: str | None = None,
    conditions: Iterable[ConditionArgs] = (),
    fields: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Write what differs, if `guard(status)` holds on a fresh read; the fields written."""
    wanted = list(conditions)

    def change(run: dict[str, Any]) -> dict[str, Any] | None:
        current = status_of(run)
        if not guard(current):
            return None
        out = dict(fields or {})
        if phase is not None:
            out["phase"] = phase
        if message is not None:
            out["message"] = message
        if wanted:
            conds = list(current.get("conditions") or [])
            for args in wanted:
                conds = set_condition(conds, *args)
            out["conditions"] = conds
        return {k: v for k, v in out.items() if current.get(k) != v} or None

    return status.update(change)


def not_terminal(status: dict[str, Any]) -> bool:
    return status.get("phase") not in TERMINAL


def same_attempt(attempt: int, phases: tuple[str | None, ...]) -> Guard:
    """Still gang `attempt`, in one of `phases`: a pod event is acted on once, never late."""

    def guard(status: dict[str, Any]) -> bool:
        return status.get("phase") in phases and status.get("restarts", 0) == attempt

    return guard


def fit_jobs(status: dict[str, Any]) -> int:
    return int((status.get("fit") or {}).get("jobs", 0))


# --- create, resume, spec changes, the periodic check --------------------------------------------


def reconcile(ctx: Context, *, new: bool = False) -> None:
    """Bring the children in line with the spec and the phase (idempotent). `new`: the run was
    just created, so its children are created without looking for them first."""
    run_obj = ctx.read()
    if run_obj is None or run_obj["metadata"].get("deletionTimestamp"):
        return
    ctx = ctx.bound(run_obj)
    run, problems = parse(run_obj)
    generation = {"observedGeneration": run_obj["metadata"].get("generation", 1)}
    if run is None:
        invalid_spec(ctx, run_obj, problems, generation)
        return
    if status_of(run_obj).get("phase") in TERMINAL:
        children.remove_workloads(ctx.kube, ctx.owner, queued=run.queue_name is not None)
        children.remove_env_server(ctx.kube, run, ctx.owner)
        return
    attempt = int(status_of(run_obj).get("restarts", 0))
    records = status_of(run_obj).get("sources") or []
    ready = not sources.missing(run, records)
    try:
        problems = initializer.problems(run)
        # The pods read the spec with the initializer's local files for the ids (sources.py).
        pods_run = sources.localized(run, records) if ready and sources.uses_hub(run) else run
    except SpecError as err:  # more files than a field holds
        problems = err.problems
    if problems:
        invalid_spec(ctx, run_obj, problems, generation)
        return
    children.ensure_static(
        ctx.kube, pods_run, ctx.owner, ctx.network, attempt, new=new, images=ctx.images
    )
    if run.spec.suspend:
        suspend(ctx, run, run_obj, generation)
        return
    if not ready:
        initialize(ctx, run, run_obj, generation)
        return
    try:
        start(ctx, run, run_obj, generation, new=new)
    except children.NoJobSetAPI as err:
        no_queue(ctx, run_obj, str(err))


def invalid_spec(
    ctx: Context, run_obj: dict[str, Any], problems: list[str], generation: dict[str, Any]
) -> None:
    """A spec the operator cannot run: Ready=False says why (one line per problem), an Event."""
    written = transition(
        ctx.status,
        not_terminal,
        phase=status_of(run_obj).get("phase") or PENDING,
        conditions=[("Ready", False, "InvalidSpec", "\n".join(problems))],
        fields=generation,
    )
    if written and "conditions" in written:
        ctx.emit(run_obj, WARNING, "InvalidSpec", "; ".join(problems))


def initialize(
    ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], generation: dict[str, Any]
) -> None:
    """Initializing until the initializer Job has recorded every hf:// source of the spec (no
    gang meanwhile: no pod waits on a download, no GPU is held); the message says what it does
    or why it failed, an Event when that changes."""
    status = status_of(run_obj)
    if status.get("phase") not in (None, PENDING, INITIALIZING):
        children.remove_workloads(ctx.kube, ctx.owner, queued=run.queue_name is not None)
    progress = initializer.ensure(ctx.kube, run, ctx.owner, ctx.images, status)
    conditions: list[ConditionArgs] = [("Ready", True, "Reconciled", "children in place")]
    if progress.created:  # a new Job: what an earlier one said is no longer news
        conditions.append((sources.CONDITION, False, progress.reason, progress.message))
    written = transition(
        ctx.status,
        not_terminal,
        phase=INITIALIZING,
        message=progress.message,
        conditions=conditions,
        fields=generation,
    )
    if written and progress.created:
        ctx.emit(run_obj, NORMAL, "Initializing", progress.message)
    elif written and "message" in written and progress.reason == sources.FAILED:
        ctx.emit(run_obj, WARNING, sources.FAILED, progress.message)


def queued(run_obj: dict[str, Any]) -> bool:
    """Whether the run's gang is a JobSet in a Kueue queue (a spec that does not parse: no)."""
    run, _ = parse(run_obj)
    return run is not None and run.queue_name is not None


def no_queue(ctx: Context, run_obj: dict[str, Any], message: str) -> None:
    """A queued run on a cluster without JobSet: Pending until there is (the periodic check
    tries again), Ready=False and a Warning saying what to install."""
    written = transition(
        ctx.status,
        lambda s: s.get("phase") in (None, PENDING),
        phase=PENDING,
        message=message,
        conditions=[("Ready", False, "NoJobSetAPI", message)],
    )
    if written and "conditions" in written:
        ctx.emit(run_obj, WARNING, "NoJobSetAPI", message)


def suspend(
    ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], generation: dict[str, Any]
) -> None:
    written = transition(
        ctx.status,
        not_terminal,
        phase=SUSPENDED,
        message="suspended: pods removed, checkpoints kept",
        conditions=[
            ("Ready", True, "Reconciled", "children in place"),
            ("Suspended", True, "SuspendRequested", "spec.suspend is true; compute clock stopped"),
        ],
        fields=generation,
    )
    children.remove_workloads(ctx.kube, ctx.owner, queued=run.queue_name is not None)
    children.remove_env_server(ctx.kube, run, ctx.owner)
    if written and "phase" in written:
        ctx.emit(run_obj, NORMAL, "Suspended", "pods removed; checkpoints kept")


def start(
    ctx: Context,
    run: ScaleRLRun,
    run_obj: dict[str, Any],
    generation: dict[str, Any],
    *,
    new: bool = False,
) -> None:
    status = status_of(run_obj)
    attempt = int(status.get("restarts", 0))
    created = children.ensure_workloads(ctx.kube, run, ctx.owner, attempt, ctx.images, new=new)
    was = status.get("phase")
    begins = was in (None, PENDING, INITIALIZING, SUSPENDED)  # the first gang since it last ran
    conditions: list[ConditionArgs] = [("Ready", True, "Reconciled", "children in place")]
    if begins:
        conditions.append(gang_created(run, attempt))
    if was == SUSPENDED:
        conditions.append(("Suspended", False, "Resumed", "resumed from the last checkpoint"))
    written = transition(
        ctx.status,
        not_terminal,
        phase=first_phase(run) if begins else was,
        message=f"gang attempt {attempt} created" if created else None,
        conditions=conditions,
        fields={
            **generation,
            "restarts": attempt,
            **({"startingSince": starting_since(run)} if begins else {}),
        },
    )
    if written and "phase" in written and was == INITIALIZING:
        recorded = "; ".join(
            f"{r['field']}: {r['uri']} = commit {r['commit']}" for r in status.get("sources") or []
        )
        ctx.emit(run_obj, NORMAL, "Initialized", recorded)
    if written and "phase" in written:
        reason = "Resumed" if was == SUSPENDED else "Created"
        ctx.emit(run_obj, NORMAL, reason, f"gang attempt {attempt}: {', '.join(created)}")
    if run.queue_name is not None and was in (QUEUED, STARTING, RUNNING):
        # Admission comes with pods (their events); an eviction takes them away quietly.
        gang_queued(ctx, run, run_obj, attempt)
    if was == STARTING:
        # What holds the gang may change with no pod event (the Job controller failing to create
        # a pod): the periodic check looks again, and ends a start that took too long.
        gang_starting(ctx, run, run_obj, attempt)
        startup_overdue(ctx, run, run_obj)


# --- pods ----------------------------------------------------------------------------------------


def on_pod(ctx: Context, pod: dict[str, Any]) -> None:
    """React to a change of one pod of the gang: a failure, trainer 0's success, or, while the
    gang starts, what its pods are waiting for."""
    meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
    if meta.get("deletionTimestamp"):
        return  # a pod we are deleting may fail on SIGTERM: that is no failure of the run
    labels = meta.get("labels") or {}
    role = labels.get(names.LABEL_ROLE)
    run_obj = ctx.read()
    if run_obj is None or role not in names.WORKLOAD_ROLES:
        return
    ctx = ctx.bound(run_obj)
    status = status_of(run_obj)
    attempt = children.attempt_of(pod)
    if attempt is None or not current_gang(status, attempt):
        return  # a pod of no gang or an earlier one, or of a run that no longer runs
    run, _ = parse(run_obj)
    if run is None:
        return
    trainer0 = role == names.ROLE_TRAINER and labels.get(names.LABEL_JOB_INDEX, "0") == "0"
    if phase == FAILED:
        gang_failed(ctx, run, run_obj, pod_failure(pod), attempt)
    elif phase == SUCCEEDED and trainer0:
        finish(ctx, run_obj, "trainer 0 exited 0: the budget is reached")
    elif status.get("phase") == QUEUED:
        gang_queued(ctx, run, run_obj, attempt)
    elif status.get("phase") == STARTING:
        gang_starting(ctx, run, run_obj, attempt)


def gang_starting(ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], attempt: int) -> None:
    """Running once every pod of gang `attempt` runs; until then PodsReady=False says why not
    (an Event whenever that changes)."""
    pods = children.gang_pods(ctx.kube, ctx.owner, attempt)
    expected = run.spec.processes
    running = sum((p.get("status") or {}).get("phase") == RUNNING for p in pods)
    guard = same_attempt(attempt, (STARTING,))
    if running == expected:
        message = f"all {expected} pods of gang attempt {attempt} are running"
        if transition(
            ctx.status,
            guard,
            phase=RUNNING,
            message=message,
            conditions=[("PodsReady", True, "AllPodsRunning", message)],
        ):
            ctx.emit(run_obj, NORMAL, "Running", message)
        return
    refused = children.refused_pods(ctx.kube, ctx.owner, attempt) if len(pods) < expected else None
    reason, why = ("FailedCreate", refused) if refused else waiting_for(pods, expected)
    if reason == "PodsStarting":  # scheduled, held in ContainerCreating: a volume may say why
        creating = [p for p in pods if (p.get("status") or {}).get("phase") != RUNNING]
        reason, why = children.volume_trouble(ctx.kube, ctx.owner, creating) or (reason, why)
    message = f"{running} of {expected} pods running; {why}"
    before = condition_of(status_of(run_obj), "PodsReady")
    written = transition(
        ctx.status, guard, message=message, conditions=[("PodsReady", False, reason, message)]
    )
    # An Event for each new thing that holds the gang; pods on their way are no news.
    if written and reason not in NO_NEWS and reason != before.get("reason"):
        ctx.emit(run_obj, WARNING, reason, message)


NO_NEWS = ("PodsStarting", "PodsNotCreated")  # reasons of a gang whose pods are on their way


def gang_created(run: ScaleRLRun, attempt: int) -> ConditionArgs:
    if run.queue_name is not None:
        message = f"gang attempt {attempt} queued in {run.queue_name}"
        return ("PodsReady", False, "Queued", message)
    return ("PodsReady", False, "PodsStarting", f"gang attempt {attempt} created")


def first_phase(run: ScaleRLRun) -> str:
    """A new gang's phase: a queued one waits for Kueue first."""
    return STARTING if run.queue_name is None else QUEUED


def starting_since(run: ScaleRLRun) -> str | None:
    """When a new gang's start begins: now, or for a queued gang at its admission (None: not
    yet; time in the queue is no startup)."""
    return now_rfc3339() if run.queue_name is None else None


def gang_queued(ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], attempt: int) -> None:
    """A queued gang: Starting once Kueue admitted it (the startup clock starting then, unless a
    start that failed already runs it); until then, or again after an eviction, Queued with
    PodsReady=False saying what Kueue says (an Event whenever that changes)."""
    waits = children.admission(ctx.kube, ctx.owner, attempt)
    status = status_of(run_obj)
    if waits is None:
        message = f"Kueue admitted gang attempt {attempt} (queue {run.queue_name})"
        written = transition(
            ctx.status,
            same_attempt(attempt, (QUEUED,)),
            phase=STARTING,
            message=message,
            conditions=[("PodsReady", False, "PodsStarting", message)],
            fields={"startingSince": status.get("startingSince") or now_rfc3339()},
        )
        if written:
            ctx.emit(run_obj, NORMAL, "Admitted", message)
            gang_starting(ctx, run, run_obj, attempt)
        return
    reason, message = waits
    evicted = status.get("phase") in (STARTING, RUNNING)  # an admitted gang taken back
    written = transition(
        ctx.status,
        same_attempt(attempt, (QUEUED, STARTING, RUNNING)),
        phase=QUEUED,
        message=message,
        conditions=[("PodsReady", False, reason, message)],
        # No fault of the gang's: its readmission starts the startup clock afresh.
        fields={"startingSince": None} if evicted else None,
    )
    if written:  # Kueue said something new (its messages change only with the queue's state)
        ctx.emit(run_obj, WARNING if reason == "Evicted" else NORMAL, reason, message)


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def waiting_for(pods: list[dict[str, Any]], expected: int) -> tuple[str, str]:
    """(reason, message) of what holds the gang: the first pod something holds, as the
    scheduler or the kubelet put it; else pods still on their way."""
    for pod in pods:
        held = pod_held(pod) if (pod.get("status") or {}).get("phase") != RUNNING else None
        if held is not None:
            return held
    if len(pods) < expected:
        return "PodsNotCreated", f"{len(pods)} of {expected} pods created (kubectl describe job)"
    return "PodsStarting", "pods are being scheduled or started"


def pod_held(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of what keeps this pod from running, or None if nothing does."""
    status, name = pod.get("status") or {}, pod["metadata"]["name"]
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "Unschedulable"
            return reason, f"pod {name}: {condition.get('message') or reason}"
    containers = (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    )
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") not in CREATING:
            detail = waiting.get("message") or f"image {container.get('image')}"
            return str(waiting["reason"]), f"pod {name}: {waiting['reason']}: {detail}"
    return None


def current_gang(status: dict[str, Any], attempt: int) -> bool:
    """Whether gang `attempt` is the one the run is running (or waiting for) now."""
    running = status.get("phase") not in (*TERMINAL, SUSPENDED)
    return running and attempt == status.get("restarts", 0)


def pod_failure(pod: dict[str, Any]) -> str:
    """`pod <name> failed: <why>` from the pod's own account of it."""
    status = pod.get("status") or {}
    why = status.get("reason") or status.get("message") or ""
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated") or {}
        if ended:
            why = f"exit code {ended.get('exitCode')}" + (
                f" ({ended['reason']})" if ended.get("reason") else ""
            )
    return f"pod {pod['metadata']['name']} failed" + (f": {why}" if why else "")


def on_workload_job(ctx: Context, job: dict[str, Any]) -> None:
    """A trainer or generator Job of the current gang failed: the gang restarts. Or, in a queued
    run, JobSet suspended it: Kueue took the admitted gang back (an eviction, a preemption).

    The Job controller counts a pod deleted before it succeeded (a drain, a preemption, an
    autoscaler's scale-down, `kubectl delete pod`) as failed and, with backoffLimit 0, fails the
    Job and deletes its other pods. The pod itself may never report Failed (it is gone), so the
    Job's condition is what says the gang is broken.
    """
    role = (job["metadata"].get("labels") or {}).get(names.LABEL_ROLE)
    failed = job_failure(job)
    if (failed is None and not job_suspended(job)) or role not in names.WORKLOAD_ROLES:
        return
    run_obj = ctx.read()
    if run_obj is None:
        return
    ctx = ctx.bound(run_obj)
    status, attempt = status_of(run_obj), children.attempt_of(job)
    if attempt is None or not current_gang(status, attempt):
        return  # no gang's Job or an earlier one's, or a run that no longer runs
    run, _ = parse(run_obj)
    if run is None:
        return
    if failed is None:
        if run.queue_name is not None and status.get("phase") in (STARTING, RUNNING):
            gang_queued(ctx, run, run_obj, attempt)
    elif not pod_reported_failure(ctx, job):
        gang_failed(ctx, run, run_obj, failed, attempt)


def pod_reported_failure(ctx: Context, job: dict[str, Any]) -> bool:
    """Whether a pod of `job` says it failed: then its own event restarts the gang, with its
    exit code in the message (the Job's condition only says the backoff limit was reached). A
    pod being deleted does not count: `on_pod` ignores it, so the Job must act for it."""
    labels = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    pods = ctx.kube.list("v1", "Pod", job["metadata"]["namespace"], labels)
    return any(
        (p.get("status") or {}).get("phase") == FAILED
        and not p["metadata"].get("deletionTimestamp")
        for p in pods
    )


def job_suspended(job: dict[str, Any]) -> bool:
    """Whether the Job is suspended: a queued gang's, by its JobSet, until Kueue admits it."""
    return bool((job.get("spec") or {}).get("suspend"))


def job_failure(job: dict[str, Any]) -> str | None:
    """`job <name> failed: <reason>: <message>` when the Job has failed, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            why = ": ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
            return f"job {job['metadata']['name']} failed" + (f": {why}" if why else "")
    return None


def gang_failed(
    ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], why: str, attempt: int
) -> None:
    """Restart the gang from the last checkpoint, or end the run Failed past the limit. A gang
    that fails while starting uses up no restart: the startup timeout bounds those."""
    status = status_of(run_obj)
    limit = run.spec.failure_policy.max_restarts
    guard = same_attempt(attempt, LIVE)
    starting = status.get("phase") == STARTING
    counted = attempt - int(status.get("startupRestarts", 0))
    if counted >= limit and not starting:
        message = f"{why}; {limit} gang restarts used (failurePolicy.maxRestarts)"
        end_failed(ctx, run_obj, guard, "RestartLimitExceeded", message)
        return
    fields: dict[str, Any] = {"restarts": attempt + 1}
    if starting:
        fields["startupRestarts"] = int(status.get("startupRestarts", 0)) + 1
        message = f"{why}; restarting the gang while it starts (no restart used up)"
    else:
        fields["startingSince"] = starting_since(run)
        message = f"{why}; restarting the gang from the last checkpoint ({counted + 1}/{limit})"
    if transition(
        ctx.status,
        guard,
        phase=first_phase(run),
        message=message,
        conditions=[gang_created(run, attempt + 1)],
        fields=fields,
    ):
        ctx.emit(run_obj, WARNING, "GangRestart", message)
        recreate_gang(ctx, run, attempt + 1)


def startup_overdue(ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any]) -> None:
    """End a run whose gangs have been starting for longer than the startup timeout."""
    status = status_of(run_obj)
    since = status.get("startingSince")
    timeout = run.spec.failure_policy.startup_timeout_seconds
    if status.get("phase") != STARTING or not since or seconds_since(since) < timeout:
        return
    held = condition_of(status, "PodsReady").get("message")
    message = f"not every pod ran within {timeout} s (failurePolicy.startupTimeoutSeconds)" + (
        f": {held}" if held else ""
    )
    attempt = int(status.get("restarts", 0))
    end_failed(ctx, run_obj, same_attempt(attempt, (STARTING,)), "StartupTimeout", message)


def end_failed(
    ctx: Context,
    run_obj: dict[str, Any],
    guard: Guard,
    reason: str,
    message: str,
    conditions: Iterable[ConditionArgs] = (),
) -> None:
    """Failed for `reason` (if `guard` holds): Ready=False says why, the gang goes, an Event."""
    written = transition(
        ctx.status,
        guard,
        phase=FAILED,
        message=message,
        conditions=[*conditions, ("Ready", False, reason, message)],
    )
    if written:
        children.remove_workloads(ctx.kube, ctx.owner, queued=queued(run_obj))
        ctx.emit(run_obj, WARNING, reason, message)


def seconds_since(rfc3339: str) -> float:
    then = datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (datetime.now(UTC) - then).total_seconds()


def recreate_gang(ctx: Context, run: ScaleRLRun, attempt: int) -> None:
    """Delete the old gang and create the new; if the old Jobs linger, the periodic
    reconcile finishes the job. The trainer Service leaves the old gang first: its terminating
    trainer 0 is no host for the new gang to meet at."""
    children.select_attempt(ctx.kube, ctx.owner, attempt)
    children.remove_workloads(ctx.kube, ctx.owner, queued=run.queue_name is not None)
    deadline = time.monotonic() + RECREATE_WAIT_S
    while True:
        try:
            children.ensure_workloads(ctx.kube, run, ctx.owner, attempt, ctx.images)
            return
        except children.StaleWorkload:
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)


def finish(ctx: Context, run_obj: dict[str, Any], message: str) -> None:
    written = transition(
        ctx.status,
        not_terminal,
        phase=SUCCEEDED,
        message=message,
        conditions=[("Ready", False, SUCCEEDED, message)],
    )
    if written:
        score_track_record(ctx.status)
        children.remove_workloads(ctx.kube, ctx.owner, queued=queued(run_obj))
        ctx.emit(run_obj, NORMAL, "BudgetReached", message)


def score_track_record(status: RunStatus) -> None:
    """The run has Succeeded: score the predictions its fits kept (status.trackRecord) against
    its last evaluation. A fit Job may write the record meanwhile: read-modify-write."""

    def change(run: dict[str, Any]) -> dict[str, Any] | None:
        current = status_of(run)
        kept = current.get(trackrecord.TRACK_RECORD)
        record = trackrecord.ended(kept, current.get("evaluations") or [])
        return None if record is None or record == kept else {trackrecord.TRACK_RECORD: record}

    status.update(change)


# --- status changes: fits and the prediction-driven stop -----------------------------------------


def fit_due(status: dict[str, Any], every: int) -> bool:
    """`every` new evaluations since the last fit Job; at the end, any new one (a last fit)."""
    new = int(status.get("evaluationCount", 0)) - int(
        (status.get("fit") or {}).get("evaluations", 0)
    )
    return new >= every or (status.get("phase") == SUCCEEDED and new > 0)


def wants_action(run_obj: dict[str, Any]) -> bool:
    """Cheap check on a watch event: is a fit or a stop possibly due? (No API calls.)"""
    status = status_of(run_obj)
    if status.get("phase") in (SUSPENDED, FAILED) or run_obj["metadata"].get("deletionTimestamp"):
        return False
    run, _ = parse(run_obj)
    if run is None:
        return False
    from scalerl.fit.decision import stop_reason  # late: scalerl.fit loads scipy

    stop = status.get("phase") != SUCCEEDED and stop_reason(
        run.spec.budget, status.get("prediction")
    )
    return bool(stop) or fit_due(status, run.spec.fit.every_evaluations)


def on_status(ctx: Context) -> None:
    """Start a fit Job when one is due, or stop a run its prediction condemns."""
    run_obj = ctx.read()
    if run_obj is None or not wants_action(run_obj):
        return
    ctx = ctx.bound(run_obj)
    run, _ = parse(run_obj)
    assert run is not None  # wants_action parsed it
    status = status_of(run_obj)
    from scalerl.fit.decision import stop_reason  # late: scalerl.fit loads scipy

    reason = stop_reason(run.spec.budget, status.get("prediction"))
    if reason is not None and status.get("phase") != SUCCEEDED:
        stop(ctx, run_obj, reason)
    elif fit_due(status, run.spec.fit.every_evaluations):
        start_fit(ctx, run, run_obj)


def stop(ctx: Context, run_obj: dict[str, Any], reason: str) -> None:
    message = f"stopped: {reason}"
    written = transition(
        ctx.status,
        lambda s: s.get("phase") in LIVE,
        phase=FAILED,
        message=message,
        conditions=[
            ("Stopped", True, "PredictedBelowTarget", reason),
            ("Ready", False, "Stopped", message),
        ],
    )
    if written:
        children.remove_workloads(ctx.kube, ctx.owner, queued=queued(run_obj))
        ctx.emit(run_obj, WARNING, "PredictedBelowTarget", message)


def fitted(kept: int, count: int) -> str:
    """What a fit of status.evaluations reads: all evaluations, or the thinned ones."""
    if kept >= count:
        return f"{count} evaluations"
    return f"{kept} of {count} evaluations (status.evaluations, thinned evenly on log compute)"


def start_fit(ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any]) -> None:
    """One fit Job at a time: the next waits until the previous one finished."""
    status = status_of(run_obj)
    jobs = fit_jobs(status)
    if children.fit_job_active(ctx.kube, ctx.owner, jobs):
        return
    count = int(status.get("evaluationCount", 0))
    kept = len(status.get("evaluations") or [])
    created = children.create_fit_job(ctx.kube, run, ctx.owner, jobs + 1, ctx.images)
    fields = {"fit": {"jobs": jobs + 1, "evaluations": count}}
    if transition(ctx.status, lambda s: fit_jobs(s) == jobs, fields=fields) and created:
        name = names.fit_job(ctx.owner.name, jobs + 1)
        ctx.emit(run_obj, NORMAL, "FitStarted", f"Job {name} fits {fitted(kept, count)}")


def cleanup(ctx: Context, run_obj: dict[str, Any]) -> int:
    """The run is being deleted: remove every child (owner references alone may lag)."""
    return children.remove_all(
        ctx.kube, ctx.owner, fit_jobs(status_of(run_obj)), queued=queued(run_obj)
    )
