"""What the operator does for a ScaleRLSweep, level-triggered and kopf-free: one ScaleRLRun per
variant (owned by the sweep, at most `maxParallel` live at once), the early stop of a variant
that cannot win (`scalerl.fit.earlystop`, on its run's status.evaluations and
status.prediction), and a leaderboard in the sweep's status (`scalerl.fit.leaderboard`, the
same rows as `scalerl sweep`'s leaderboard.json; the Leader is its first row).

A stopped variant's run is suspended, not deleted: its pods go, its checkpoints stay, and the
annotations `scalerl.dev/stopped-by-sweep` (why) and `scalerl.dev/stop-evidence` ("measured" or
"fit") say so. Setting its `spec.suspend` back to false resumes it: the sweep then counts it as
running again, removes those annotations (the Stopped gauge goes back to 0) and marks it
`scalerl.dev/resumed-after-stop`, so that the early stop does not undo the user's decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalerl.errors import SpecError
from scalerl.kube import Kube
from scalerl.operator import names
from scalerl.operator.lifecycle import TERMINAL
from scalerl.spec import (
    API_VERSION,
    FAILED,
    KIND,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    ScaleRLRun,
    ScaleRLSweep,
    parse_sweep,
)
from scalerl.status.conditions import set_condition

if TYPE_CHECKING:  # the fit stack is heavy: the operator imports it where it fits
    from scalerl.fit.earlystop import Stop
    from scalerl.fit.leaderboard import Entry, Standing

SWEEP_KIND = "ScaleRLSweep"
LABEL_SWEEP = "scalerl.dev/sweep"
LABEL_VARIANT = "scalerl.dev/variant"
STOPPED_BY = "scalerl.dev/stopped-by-sweep"
STOP_EVIDENCE = "scalerl.dev/stop-evidence"
RESUMED = "scalerl.dev/resumed-after-stop"

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
    for variant in resumed(existing):
        body: dict[str, Any] = {
            "metadata": {"annotations": {STOPPED_BY: None, STOP_EVIDENCE: None, RESUMED: "true"}}
        }
        name = existing[variant]["metadata"]["name"]
        existing[variant] = ctx.kube.patch(API_VERSION, KIND, ctx.namespace, name, body)
        ctx.emit(sweep_obj, "Normal", "VariantResumed", f"variant {variant} resumed by its user")
    for variant, stop in stop_losers(sweep, runs, existing).items():
        body = {
            "metadata": {"annotations": {STOPPED_BY: stop.reason, STOP_EVIDENCE: stop.evidence}},
            "spec": {"suspend": True},
        }
        name = existing[variant]["metadata"]["name"]
        existing[variant] = ctx.kube.patch(API_VERSION, KIND, ctx.namespace, name, body)
        message = f"variant {variant} stopped ({stop.evidence}): {stop.reason}"
        ctx.emit(sweep_obj, "Normal", "VariantStopped", message[:1024])
    board = leaderboard(sweep, runs, existing)
    write_status(ctx, sweep_obj, summary(sweep, board), True, "runs in place")


def cleanup(ctx: SweepContext) -> int:
    """The sweep is being deleted: delete its runs (their owner reference alone waits for the
    garbage collector, which may not know the sweep's kind for a while); how many."""
    runs = ctx.runs().values()
    for run in runs:
        _FITS.pop(run["metadata"]["name"], None)  # its fits are of no more use
    return sum(
        ctx.kube.delete(API_VERSION, KIND, ctx.namespace, r["metadata"]["name"]) for r in runs
    )


def phase(run: dict[str, Any] | None) -> str:
    """A variant's phase from its run: Pending (no run yet), Stopped (suspended by the sweep),
    Succeeded or Failed (its run's end), else Running (a stopped run its user resumed too)."""
    if run is None:
        return PENDING
    if _annotations(run).get(STOPPED_BY) and (run.get("spec") or {}).get("suspend"):
        return STOPPED
    run_phase = (run.get("status") or {}).get("phase")
    return str(run_phase) if run_phase in TERMINAL else RUNNING


def _annotations(run: dict[str, Any]) -> dict[str, Any]:
    return dict(run["metadata"].get("annotations") or {})


def resumed(existing: dict[str, dict[str, Any]]) -> list[str]:
    """Variants the sweep stopped and their users resumed (spec.suspend false again), still
    marked as stopped."""
    return [
        v
        for v, run in existing.items()
        if _annotations(run).get(STOPPED_BY) and not (run.get("spec") or {}).get("suspend")
    ]


def start_due(
    sweep: ScaleRLSweep, runs: dict[str, ScaleRLRun], existing: dict[str, dict[str, Any]]
) -> dict[str, ScaleRLRun]:
    """The variants to start now, in order: those without a run while fewer than maxParallel
    run."""
    live = sum(phase(existing.get(v)) == RUNNING for v in runs)
    free = max(0, sweep.spec.max_parallel - live)
    due = [v for v in runs if v not in existing][:free]
    return {v: runs[v] for v in due}


def stop_losers(
    sweep: ScaleRLSweep, runs: dict[str, ScaleRLRun], existing: dict[str, dict[str, Any]]
) -> dict[str, Stop]:
    """The running variants to stop now (`scalerl.fit.earlystop`), except those their users
    resumed after a stop."""
    from scalerl.fit.earlystop import losers

    rule = sweep.spec.early_stop
    if rule is None:
        return {}
    judged = [standing(v, runs[v], run) for v, run in existing.items() if v in runs]
    return {
        v: stop
        for v, stop in losers(judged, rule.min_points).items()
        if phase(existing[v]) == RUNNING and not _annotations(existing[v]).get(RESUMED)
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


def standing(variant: str, spec: ScaleRLRun, run: dict[str, Any] | None) -> Standing:
    """The variant as the leaderboard and the early stop see it, from its run object."""
    from scalerl.fit.leaderboard import Evaluations, Standing

    status = (run or {}).get("status") or {}
    evaluations = Evaluations.from_rows(
        status.get("evaluations") or [],
        compute="computeHours",
        pass_rate="passRate",
        se="passRateSE",
        excluded="fitExcluded",
    )
    notes = {} if run is None else _annotations(run)
    return Standing(
        name=variant,
        run=spec,
        phase=phase(run),
        evaluations=evaluations,
        prediction=status.get("prediction"),
        stop_reason=notes.get(STOPPED_BY),
        stop_evidence=notes.get(STOP_EVIDENCE),
        failure=status.get("message") if status.get("phase") == FAILED else None,
    )


def leaderboard(
    sweep: ScaleRLSweep, runs: dict[str, ScaleRLRun], existing: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The variants best first (`scalerl.fit.leaderboard.board`): each fitted from its run's
    status.evaluations, weighted by their passRateSE, as `scalerl sweep` fits its histories."""
    from scalerl.fit.leaderboard import board

    standings = [standing(v.name, runs[v.name], existing.get(v.name)) for v in sweep.spec.variants]
    return board(standings, [_entry(s) for s in standings])


# The last fit of each run, by its evaluations: a periodic check refits only what changed.
_FITS: dict[str, tuple[bytes, Entry]] = {}


def _entry(s: Standing) -> Entry:
    from scalerl.fit.leaderboard import entry_of

    ev = s.evaluations
    key = b"".join(a.tobytes() for a in (ev.compute, ev.pass_rate, ev.se) if a is not None)
    key += repr(s.run.spec.fit.min_compute).encode()
    cached = _FITS.get(s.run.name)
    if cached is None or cached[0] != key:
        cached = _FITS[s.run.name] = (key, entry_of(s))
    return cached[1]


def summary(sweep: ScaleRLSweep, board: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's status: its phase (Failed when it ended with no variant Succeeded), counts,
    the leader (the leaderboard's first row, once it has a fit) and the leaderboard."""
    phases = [r["phase"] for r in board]
    leader = board[0] if board and board[0]["A"] is not None else None
    finished = all(p in (STOPPED, SUCCEEDED, FAILED) for p in phases)
    counts = {p: phases.count(p) for p in (RUNNING, STOPPED, SUCCEEDED, FAILED, PENDING)}
    return {
        "phase": ("Succeeded" if SUCCEEDED in phases else "Failed") if finished else "Running",
        "message": ", ".join(f"{n} {p.lower()}" for p, n in counts.items()),
        "leader": None if leader is None else leader["name"],
        "leaderA": None if leader is None else leader["A"],
        "running": counts[RUNNING],
        "stopped": counts[STOPPED],
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
