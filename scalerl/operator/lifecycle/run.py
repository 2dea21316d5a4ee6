"""A run brought in line with its spec and phase (level-triggered, idempotent): an invalid spec,
the initializer's downloads, a suspension, the gang's creation; and its deletion."""

from __future__ import annotations

from typing import Any

from scalerl.errors import SpecError
from scalerl.operator import children, codepods, initializer, sandboxcheck, sources
from scalerl.operator.lifecycle.gang import (
    end_failed,
    first_phase,
    gang_created,
    gang_queued,
    gang_starting,
    generators_ready,
    starting_since,
    startup_overdue,
)
from scalerl.operator.lifecycle.state import (
    INITIALIZING,
    NORMAL,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    SUSPENDED,
    TERMINAL,
    WARNING,
    ConditionArgs,
    Context,
    fit_jobs,
    not_terminal,
    parse,
    queued,
    status_of,
    transition,
)
from scalerl.operator.sandboxcheck import Verdict
from scalerl.spec import ScaleRLRun


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
    if codepods.scores_code(run) and status_of(run_obj).get("phase") in (
        None,
        PENDING,
        INITIALIZING,
    ):
        verdict = sandboxcheck.ensure(ctx.kube, run, ctx.owner, ctx.images)
        if verdict.reason != sandboxcheck.READY:
            check_sandbox(ctx, run_obj, generation, verdict)
            return
        checked: list[ConditionArgs] = [
            (sandboxcheck.CONDITION, True, verdict.reason, verdict.message)
        ]
    else:
        checked = []
    try:
        start(ctx, run, run_obj, generation, new=new, conditions=checked)
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


def check_sandbox(
    ctx: Context, run_obj: dict[str, Any], generation: dict[str, Any], verdict: Verdict
) -> None:
    """Initializing while the sandbox check runs (no gang meanwhile: no GPU waits on it);
    Failed with SandboxUnavailable, in the check's own words, where it found no sandbox."""
    if verdict.reason == sandboxcheck.UNAVAILABLE:
        end_failed(
            ctx,
            run_obj,
            lambda s: s.get("phase") in (None, PENDING, INITIALIZING),
            sandboxcheck.UNAVAILABLE,
            verdict.message,
            [(sandboxcheck.CONDITION, False, verdict.reason, verdict.message)],
        )
        return
    written = transition(
        ctx.status,
        not_terminal,
        phase=INITIALIZING,
        message=verdict.message,
        conditions=[
            ("Ready", True, "Reconciled", "children in place"),
            (sandboxcheck.CONDITION, False, verdict.reason, verdict.message),
        ],
        fields=generation,
    )
    if written and verdict.created:
        ctx.emit(run_obj, NORMAL, "CheckingSandbox", verdict.message)


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
    conditions: list[ConditionArgs] | None = None,
) -> None:
    """The gang, created where missing; `conditions` go with its first status (the sandbox
    check's verdict)."""
    status = status_of(run_obj)
    attempt = int(status.get("restarts", 0))
    workloads = children.ensure_workloads(ctx.kube, run, ctx.owner, attempt, ctx.images, new=new)
    was = status.get("phase")
    begins = was in (None, PENDING, INITIALIZING, SUSPENDED)  # the first gang since it last ran
    conditions = [("Ready", True, "Reconciled", "children in place"), *(conditions or [])]
    if begins:
        conditions.append(gang_created(run, attempt))
    if was == SUSPENDED:
        conditions.append(("Suspended", False, "Resumed", "resumed from the last checkpoint"))
    written = transition(
        ctx.status,
        not_terminal,
        phase=first_phase(run) if begins else was,
        message=f"gang attempt {attempt} created" if workloads.created else None,
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
        ctx.emit(run_obj, NORMAL, reason, f"gang attempt {attempt}: {', '.join(workloads.created)}")
    if workloads.resized_from is not None:  # `kubectl scale srl` while the gang runs
        generators_ready(ctx, run, attempt)
        message = (
            f"generators {workloads.resized_from} -> {run.spec.generators.replicas} while the "
            "gang runs; training goes on"
        )
        ctx.emit(run_obj, NORMAL, "GeneratorsScaled", message)
    if run.queue_name is not None and was in (QUEUED, STARTING, RUNNING):
        # Admission comes with pods (their events); an eviction takes them away quietly.
        gang_queued(ctx, run, run_obj, attempt)
    if was == STARTING:
        # What holds the gang may change with no pod event (the Job controller failing to create
        # a pod): the periodic check looks again, and ends a start that took too long.
        gang_starting(ctx, run, run_obj, attempt)
        startup_overdue(ctx, run, run_obj)


def cleanup(ctx: Context, run_obj: dict[str, Any]) -> int:
    """The run is being deleted: remove every child (owner references alone may lag)."""
    return children.remove_all(
        ctx.kube, ctx.owner, fit_jobs(status_of(run_obj)), queued=queued(run_obj)
    )
