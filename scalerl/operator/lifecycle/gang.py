"""A run's gang as it lives: its pods and Jobs watched while it starts (PodsReady says what holds
it), a queued gang's admission and eviction by Kueue, a failed generator replaced alone while
the trainer trains on, a failed gang restarted from the last checkpoint or the run ended Failed,
and trainer 0's success ending it Succeeded.

A generator's failure (its process killed, OOM, its pod deleted or preempted) costs no gang
restart: its Job starts a replacement of the same index (`scalerl.operator.gang`), which joins
the weight-sync group mid-run as it does under `scalerl run`. The operator counts it in
`status.generators` (`replaced`, and `ready`: the generator pods running now) with a
`GeneratorReplaced` Event. A generator that fails again before the trainer trained a step since
its last replacement would only fail again: that restarts the gang, as a trainer's failure does.
A generator whose index is past the pool's size (`kubectl scale srl` down: the Job controller
removes it) is no failure.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from scalerl.operator import children, names, trackrecord
from scalerl.operator.lifecycle.state import (
    CREATING,
    FAILED,
    LIVE,
    NORMAL,
    QUEUED,
    RECREATE_WAIT_S,
    RUNNING,
    STARTING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    WARNING,
    ConditionArgs,
    Context,
    Guard,
    condition_of,
    not_terminal,
    parse,
    queued,
    same_attempt,
    status_of,
    transition,
)
from scalerl.spec import ScaleRLRun
from scalerl.status.conditions import now_rfc3339
from scalerl.status.kubernetes import RunStatus


def on_pod(ctx: Context, pod: dict[str, Any]) -> None:
    """React to a change of one pod of the gang: a failure, trainer 0's success, or, while the
    gang starts, what its pods are waiting for."""
    meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
    labels = meta.get("labels") or {}
    role = labels.get(names.LABEL_ROLE)
    # A pod we are deleting may fail on SIGTERM: no failure of the run (its gang is no longer
    # current by then). A generator being deleted by someone else is one to replace.
    if meta.get("deletionTimestamp") and role != names.ROLE_GENERATOR:
        return
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
    if role == names.ROLE_GENERATOR:
        generators_ready(ctx, run, attempt)
        if int(labels.get(names.LABEL_JOB_INDEX, 0)) >= run.spec.generators.replicas:
            return  # scaled away: the Job removes the indexes past the pool's new size
    if phase == FAILED and role == names.ROLE_GENERATOR:
        generator_failed(ctx, run, run_obj, pod, attempt)
    elif phase == FAILED:
        gang_failed(ctx, run, run_obj, pod_failure(pod), attempt)
    elif meta.get("deletionTimestamp"):
        return  # a generator on its way out: its failure, when it comes, is what counts
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
# The Job controller's count, on each pod of an index, of that index's failures before it.
INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"


def generator_failed(
    ctx: Context, run: ScaleRLRun, run_obj: dict[str, Any], pod: dict[str, Any], attempt: int
) -> None:
    """A generator's pod failed: its Job starts a replacement, counted once per pod in
    `status.generators` with a GeneratorReplaced Event; or, where the generator failed again
    before the trainer trained a step since its last replacement, the gang restarts."""
    name, why = pod["metadata"]["name"], pod_failure(pod)
    index = (pod["metadata"].get("labels") or {}).get(names.LABEL_JOB_INDEX, "?")
    # The index's failures before this pod was made: which of its pods this is (a pod reports
    # its failure more than once, an earlier pod's report may come after a later one's).
    nth = int((pod["metadata"].get("annotations") or {}).get(INDEX_FAILURES, 0))
    desired = run.spec.generators.replicas
    again: list[str] = []

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        current = status_of(fresh)
        if not same_attempt(attempt, LIVE)(current):
            return None
        generators = dict(current.get("generators") or {})
        failures = dict(generators.get("failures") or {})
        before = failures.get(index) or {}
        if before and before.get("nth", 0) >= nth:
            return None  # counted already
        step = int((current.get("progress") or {}).get("step", 0))
        if before and before.get("step") == step:
            again.append(
                f"{why}: generator {index} failed again before a step was trained since it was "
                "last replaced"
            )
            return None
        failures[index] = {"pod": name, "nth": nth, "step": step}
        replaced = int(generators.get("replaced", 0)) + 1
        return {
            "generators": {
                **generators,
                "desired": desired,
                "replaced": replaced,
                "failures": failures,
            }  # fmt: skip
        }

    written = ctx.status.update(change)
    if again:
        gang_failed(ctx, run, run_obj, again[0], attempt)
    elif written:
        replaced = written["generators"]["replaced"]
        message = (
            f"{why}; generator {index} is replaced alone and training goes on "
            f"({replaced} generator replacements in this run)"
        )
        ctx.emit(run_obj, WARNING, "GeneratorReplaced", message)


def generators_ready(ctx: Context, run: ScaleRLRun, attempt: int) -> None:
    """`status.generators.ready`: the generator pods of gang `attempt` running now."""
    pods = children.gang_pods(ctx.kube, ctx.owner, attempt)
    ready = sum(
        (p["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == names.ROLE_GENERATOR
        and (p.get("status") or {}).get("phase") == RUNNING
        for p in pods
    )
    desired = run.spec.generators.replicas

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        current = status_of(fresh)
        generators = dict(current.get("generators") or {})
        if not current_gang(current, attempt) or (
            generators.get("ready"), generators.get("desired")) == (ready, desired):  # fmt: skip
            return None
        return {"generators": {**generators, "ready": ready, "desired": desired}}

    ctx.status.update(change)


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
    elif role == names.ROLE_GENERATOR or not pod_reported_failure(ctx, job):
        # A generator's Job fails only once an index used up its retries: its pods' failures
        # were replacements, so the Job is what restarts the gang.
        gang_failed(ctx, run, run_obj, failed, attempt)


def pod_reported_failure(ctx: Context, job: dict[str, Any]) -> bool:
    """Whether a (trainer's) pod of `job` says it failed: then its own event restarts the gang,
    with its exit code in the message (the Job's condition only says the backoff limit was
    reached). A pod being deleted does not count: `on_pod` ignores it, so the Job must act."""
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
    if "generators" in status:  # the new gang's generators start afresh; replaced is the run's
        fields["generators"] = {**status["generators"], "ready": 0, "failures": {}}
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


def score_track_record(status: RunStatus, stopped: str | None = None) -> None:
    """The run has ended (Succeeded, or `stopped` by its prediction for that reason): score the
    predictions its fits kept (status.trackRecord) against its last evaluation, under the budget
    its spec holds now (a prediction made for another is void). A fit Job may write the record
    meanwhile: read-modify-write."""
    from scalerl.fit.outlook import budget_set  # late: scalerl.fit loads scipy

    def change(run: dict[str, Any]) -> dict[str, Any] | None:
        current = status_of(run)
        kept = current.get(trackrecord.TRACK_RECORD)
        parsed, _ = parse(run)
        budget = None if parsed is None else budget_set(parsed.spec.budget)
        record = trackrecord.ended(kept, current.get("evaluations") or [], budget, stopped)
        return None if record is None or record == kept else {trackrecord.TRACK_RECORD: record}

    status.update(change)
