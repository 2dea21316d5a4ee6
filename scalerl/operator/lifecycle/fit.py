"""Status changes: a fit Job when enough new evaluations are in, and the prediction-driven stop
(`budget.stopWhen`)."""

from __future__ import annotations

from typing import Any

from scalerl.operator import children, names
from scalerl.operator.lifecycle.gang import score_track_record
from scalerl.operator.lifecycle.state import (
    FAILED,
    LIVE,
    NORMAL,
    SUCCEEDED,
    SUSPENDED,
    WARNING,
    Context,
    fit_jobs,
    parse,
    queued,
    status_of,
    transition,
)
from scalerl.spec import ScaleRLRun


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
        score_track_record(ctx.status, stopped=reason)
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
