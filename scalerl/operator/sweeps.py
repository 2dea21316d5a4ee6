"""What the operator does for a ScaleRLSweep, level-triggered and kopf-free: one ScaleRLRun per
variant (owned by the sweep, at most `maxParallel` live at once), the early stop of a variant
whose A interval lies wholly below the best one's, and a leaderboard in the sweep's status.

A stopped variant's run is suspended, not deleted: its pods go, its checkpoints stay, and the
annotation `scalerl.dev/stopped-by-sweep` says why; unsuspending it resumes it. The leaderboard
ranks the variants the paper's way (`scalerl.fit.leaderboard`) from their runs' evaluations and
predictions; a variant leads only with a fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalerl.errors import ScaleRLError, SpecError
from scalerl.kube import Kube
from scalerl.operator import names
from scalerl.operator.lifecycle import TERMINAL
from scalerl.spec import API_VERSION, KIND, ScaleRLRun, ScaleRLSweep, parse_sweep
from scalerl.status.conditions import set_condition

SWEEP_KIND = "ScaleRLSweep"
LABEL_SWEEP = "scalerl.dev/sweep"
LABEL_VARIANT = "scalerl.dev/variant"
STOPPED_BY = "scalerl.dev/stopped-by-sweep"
PENDING, RUNNING, STOPPED, DONE = "Pending", "Running", "Stopped", "Done"

# (sweep object, event type, reason, message)
Emit = Callable[[dict[str, Any], str, str, str], None]


@dataclass(frozen=True)
class SweepContext:
    kube: Kube
    namespace: str
    name: str
    emit: Emit

    def read(self) -> dict[str, Any] | None:
        return self.kube.find(API_VERSION, SWEEP_KIND, self.namespace, self.name)

    def runs(self) -> dict[str, dict[str, Any]]:
        """The sweep's runs by variant (their label)."""
        found = self.kube.list(API_VERSION, KIND, self.namespace, {LABEL_SWEEP: self.name})
        return {r["metadata"]["labels"][LABEL_VARIANT]: r for r in found}


def reconcile(ctx: SweepContext) -> None:
    """Create the runs that are due, stop the losers, write the leaderboard (idempotent)."""
    sweep_obj = ctx.read()
    if sweep_obj is None or sweep_obj["metadata"].get("deletionTimestamp"):
        return
    try:
        sweep = parse_sweep(sweep_obj)
        runs = sweep.variant_runs()
        problems = [p for run in runs.values() for p in names.name_problems(run.name)]
        if problems:
            raise SpecError(problems)
    except SpecError as err:
        message = "\n".join(err.problems)
        if write_status(ctx, sweep_obj, {"phase": "Failed", "message": message}, False, message):
            ctx.emit(sweep_obj, "Warning", "InvalidSpec", "; ".join(err.problems)[:1024])
        return
    # One list of the runs a check: the create and the patch below answer with the object.
    existing = ctx.runs()
    for variant, run in start_due(sweep, runs, existing).items():
        created = ctx.kube.create(run_object(sweep_obj, variant, run))
        if created is None:  # it was there already: a check that raced this one made it
            continue
        existing[variant] = created
        ctx.emit(sweep_obj, "Normal", "VariantStarted", f"run {run.name} for variant {variant}")
    for variant, reason in stop_losers(sweep, existing).items():
        body = {"metadata": {"annotations": {STOPPED_BY: reason}}, "spec": {"suspend": True}}
        name = existing[variant]["metadata"]["name"]
        existing[variant] = ctx.kube.patch(API_VERSION, KIND, ctx.namespace, name, body)
        ctx.emit(sweep_obj, "Normal", "VariantStopped", f"variant {variant} stopped: {reason}")
    board = leaderboard(sweep, existing)
    write_status(ctx, sweep_obj, summary(sweep, board), True, "runs in place")


def cleanup(ctx: SweepContext) -> int:
    """The sweep is being deleted: delete its runs (their owner reference alone waits for the
    garbage collector, which may not know the sweep's kind for a while); how many."""
    runs = ctx.runs().values()
    return sum(
        ctx.kube.delete(API_VERSION, KIND, ctx.namespace, r["metadata"]["name"]) for r in runs
    )


def state(run: dict[str, Any] | None) -> str:
    """A variant's state from its run: Pending (no run yet), Running, Stopped, Done."""
    if run is None:
        return PENDING
    if (run["metadata"].get("annotations") or {}).get(STOPPED_BY):
        return STOPPED
    phase = (run.get("status") or {}).get("phase")
    return DONE if phase in TERMINAL else RUNNING


def start_due(
    sweep: ScaleRLSweep, runs: dict[str, ScaleRLRun], existing: dict[str, dict[str, Any]]
) -> dict[str, ScaleRLRun]:
    """The variants to start now, in order: those without a run while fewer than maxParallel
    run."""
    live = sum(state(existing.get(v)) == RUNNING for v in runs)
    free = max(0, sweep.spec.max_parallel - live)
    due = [v for v in runs if v not in existing][:free]
    return {v: runs[v] for v in due}


def stop_losers(sweep: ScaleRLSweep, existing: dict[str, dict[str, Any]]) -> dict[str, str]:
    from scalerl.fit.leaderboard import losers  # late: the leaderboard needs the fitter

    rule = sweep.spec.early_stop
    if rule is None:
        return {}
    fits = {
        v: prediction
        for v, run in existing.items()
        if (prediction := (run.get("status") or {}).get("prediction"))
    }
    return {
        v: why for v, why in losers(fits, rule.min_points).items() if state(existing[v]) == RUNNING
    }


def run_object(sweep_obj: dict[str, Any], variant: str, run: ScaleRLRun) -> dict[str, Any]:
    meta = sweep_obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": run.name,
            "namespace": meta["namespace"],
            "labels": {LABEL_SWEEP: meta["name"], LABEL_VARIANT: variant},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": SWEEP_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": run.spec.model_dump(by_alias=True, mode="json"),  # nulls are choices too
    }


def leaderboard(sweep: ScaleRLSweep, existing: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The variants best first (the paper's rule on their runs' evaluations), each a row."""
    import numpy as np

    from scalerl.fit.fitter import fit_curve
    from scalerl.fit.leaderboard import Entry, rank

    entries = []
    for variant in (v.name for v in sweep.spec.variants):
        run = existing.get(variant) or {}
        points = sorted((run.get("status") or {}).get("evaluations") or [], key=_compute)
        compute = np.array([p["computeHours"] for p in points], dtype=float)
        rates = np.array([p["passRate"] for p in points], dtype=float)
        floor = float(((run.get("spec") or {}).get("fit") or {}).get("minCompute", 0.0))
        try:
            fit = fit_curve(compute, rates, min_compute=floor, bootstrap=0)
        except ScaleRLError:
            fit = None
        entries.append(Entry(variant, fit, compute, rates))
    return [row(e.name, existing.get(e.name), e.compute) for e in rank(entries)]


def _compute(point: dict[str, Any]) -> float:
    return float(point["computeHours"])


def row(variant: str, run: dict[str, Any] | None, compute: Any) -> dict[str, Any]:
    status = (run or {}).get("status") or {}
    prediction = status.get("prediction") or {}
    spent = float(compute[-1]) if len(compute) else 0.0
    stopped = state(run) == STOPPED
    saved = max(0.0, float(prediction.get("budget") or 0.0) - spent) if stopped else None
    return {
        "variant": variant,
        "run": None if run is None else run["metadata"]["name"],
        "state": state(run),
        "phase": status.get("phase"),
        "A": prediction.get("A"),
        "A_interval": prediction.get("A_interval"),
        "B": prediction.get("B"),
        "C_mid": prediction.get("C_mid"),
        "points": prediction.get("points"),
        "computeHours": spent,
        "stopReason": ((run or {}).get("metadata", {}).get("annotations") or {}).get(STOPPED_BY),
        "computeSaved": saved,
    }


def summary(sweep: ScaleRLSweep, board: list[dict[str, Any]]) -> dict[str, Any]:
    states = [r["state"] for r in board]
    leader = next((r for r in board if r["A"] is not None), None)
    finished = all(s in (STOPPED, DONE) for s in states)
    return {
        "phase": "Succeeded" if finished else "Running",
        "message": f"{states.count(RUNNING)} running, {states.count(STOPPED)} stopped, "
        f"{states.count(DONE)} done, {states.count(PENDING)} pending",
        "leader": None if leader is None else leader["variant"],
        "leaderA": None if leader is None else leader["A"],
        "running": states.count(RUNNING),
        "stopped": states.count(STOPPED),
        "computeSaved": sum(r["computeSaved"] or 0.0 for r in board),
        "leaderboard": board,
    }


def write_status(
    ctx: SweepContext, sweep_obj: dict[str, Any], fields: dict[str, Any], ok: bool, message: str
) -> bool:
    """Merge `fields` and the Ready condition into the sweep's status; whether anything changed."""
    current = sweep_obj.get("status") or {}
    reason = "Reconciled" if ok else "InvalidSpec"
    conditions = set_condition(list(current.get("conditions") or []), "Ready", ok, reason, message)
    wanted = {**fields, "conditions": conditions}
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not changed:
        return False
    ctx.kube.patch(
        API_VERSION, SWEEP_KIND, ctx.namespace, ctx.name, {"status": changed}, sub="status"
    )
    return True
