"""What every part of a run's life uses: the phases, the context a handler acts in, the parsed
run, and the guarded status transition (read, check the guard, write with a resourceVersion
precondition)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from scalerl.errors import SpecError
from scalerl.kube import Kube, KubeError
from scalerl.operator import names
from scalerl.operator.manifests import Images, NetworkSettings, Owner
from scalerl.operator.schema import PHASES
from scalerl.spec import ScaleRLRun, parse_run
from scalerl.status.conditions import set_condition
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


def queued(run_obj: dict[str, Any]) -> bool:
    """Whether the run's gang is a JobSet in a Kueue queue (a spec that does not parse: no)."""
    run, _ = parse(run_obj)
    return run is not None and run.queue_name is not None


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})
