"""The cluster end of the status sink: the ScaleRLRun's status subresource.

Trainer 0 patches `status.progress` after every step and `status.evaluations` after every
evaluation, with the run's own ServiceAccount (its Role allows get/patch on this run's status
only). The status stays small: evaluations are thinned evenly on log compute to at most
EVALUATIONS_KEPT points, while the full history goes to `history.jsonl` on the checkpoint volume
(the same files a local run writes). API errors are retried a few times, then logged: losing a
status update must never stop training.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerl.errors import InputError
from scalerl.kube import Kube, KubeError, retrying
from scalerl.status.conditions import now_rfc3339, set_condition
from scalerl.status.files import FileStatus
from scalerl.status.history import HistoryRow, Progress, PromptScore, TrainSummary

log = logging.getLogger(__name__)

API_VERSION = "scalerl.dev/v1alpha1"
KIND = "ScaleRLRun"
EVALUATIONS_KEPT = 300
_INTEGERS = frozenset({"step", "policyVersion", "maxSteps"})
# An evaluation's numbers: history row key -> the status's name.
_EVALUATION_NUMBERS = {
    "compute": "computeHours",
    "pass_rate": "passRate",
    "pass_rate_se": "passRateSE",
    "eval_truncation_rate": "truncationRate",
}
# The CRD requires them: a point's place on the curve.
_PLACE = ("computeHours", "passRate")

Change = Callable[[dict[str, Any]], dict[str, Any] | None]


def round_value(value: float) -> float:
    """Six significant digits: readable in `kubectl get`, far below any noise in the numbers."""
    return float(f"{value:.6g}")


def status_progress(progress: Progress) -> dict[str, Any]:
    """status.progress (the CRD's names) from the trainer's progress."""
    train = progress.train or TrainSummary()
    values: dict[str, float | None] = {
        "step": progress.step,
        "policyVersion": progress.version,
        "maxSteps": progress.max_steps,
        "computeHours": progress.compute,
        "evalPassRate": progress.eval_pass_rate,
        "trainPassRate": train.pass_rate,
        "truncationRate": train.truncation_rate,
        "entropy": train.entropy,
        "policyLag": train.policy_lag,
    }
    out: dict[str, Any] = {"updatedAt": now_rfc3339()}
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            out[name] = int(value) if name in _INTEGERS else round_value(value)
    return out


def status_evaluation(entry: dict[str, Any]) -> dict[str, Any]:
    """One history row (`HistoryRow` as a dict) in the status's shape; nothing that is not a
    finite number reaches the API server (JSON has no NaN: a real server answers 400), so such
    a field is left out (`not_finite` names it)."""
    out: dict[str, Any] = {"step": int(entry["step"])}
    for key, name in _EVALUATION_NUMBERS.items():
        value = entry.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[name] = round_value(value)
    samples = entry.get("eval_samples")
    if isinstance(samples, int):
        out["samples"] = samples
    # Samples that could not be scored (counted as not passed) and why; an evaluation the fit
    # leaves out says why (the fit Job fits status.evaluations: it must see the mark).
    unscored = entry.get("eval_unscored")
    if isinstance(unscored, int) and unscored:
        out["unscored"] = unscored
        out["unscoredReasons"] = dict(entry.get("eval_unscored_reasons") or {})
    excluded = entry.get("fit_excluded")
    if isinstance(excluded, str) and excluded:
        out["fitExcluded"] = excluded
    when = entry.get("time")
    if isinstance(when, int | float) and math.isfinite(when):
        out["time"] = int(when)  # whole seconds: six significant digits would blur a unix time
    by_domain = _by_domain(entry.get("pass_rate_by_domain") or {})
    if by_domain:
        out["byDomain"] = by_domain
    return out


def _by_domain(rates: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each domain's pass rate (history's `pass_rate_by_domain`) in the status's names; a domain
    whose pass rate is not a finite number is left out (it has no place on its curve)."""
    out = {}
    for domain, rate in rates.items():
        point: dict[str, Any] = {}
        for key, name in (("pass_rate", "passRate"), ("pass_rate_se", "passRateSE")):
            value = rate.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                point[name] = round_value(value)
        if "passRate" in point:
            if isinstance(rate.get("samples"), int):
                point["samples"] = rate["samples"]
            out[domain] = point
    return out


def not_finite(entry: dict[str, Any]) -> list[str]:
    """The status's names of a history row's numbers that are NaN or infinite."""
    return [
        name
        for key, name in _EVALUATION_NUMBERS.items()
        if isinstance(entry.get(key), float) and not math.isfinite(entry[key])
    ]


def placed(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The evaluation as the status holds it, with a warning naming any field left out; None
    when its compute or pass rate is not a number (no place on the curve: only history.jsonl
    keeps it)."""
    out = status_evaluation(entry)
    missing = not_finite(entry)
    kept = all(name in out for name in _PLACE)
    if missing:
        what = "sent without them" if kept else "left out of status.evaluations"
        named = ", ".join(missing)
        log.warning("status: evaluation at step %s: %s not finite, %s", entry["step"], named, what)
    return out if kept else None


def thin(entries: list[dict[str, Any]], keep: int = EVALUATIONS_KEPT) -> list[dict[str, Any]]:
    """At most `keep` entries spread evenly on log compute; the first and last always stay.

    The first (the step-0 evaluation, R0, at compute 0) anchors the fit and stays whatever its
    compute. The rest lie on the positive computes, where the curve's shape lives on a log axis:
    every point keeps a log gap of at least `gap` to the one kept before it, with the smallest
    gap that keeps no more than `keep`. So the sparse early points of a schedule that is even on
    linear compute all stay, and the dense late ones are spread evenly on the log axis.
    """
    if keep < 3:
        raise ValueError(f"thin keeps at least 3 entries (first, last and one between), not {keep}")
    if len(entries) <= keep:
        return list(entries)
    rest = [i for i in range(1, len(entries)) if float(entries[i]["computeHours"]) > 0]
    logs = [math.log(float(entries[i]["computeHours"])) for i in rest]
    if len(rest) < 2:  # nothing past compute 0 to spread: the ends only
        return [entries[0], entries[-1]]
    low, high = 0.0, max(logs) - min(logs)  # at `high` only the first positive and the last stay
    for _ in range(60):  # the count falls as the gap grows: bisect for the smallest that fits
        gap = (low + high) / 2
        if len(_spaced(logs, gap)) + 1 > keep:
            low = gap
        else:
            high = gap
    return [entries[0], *(entries[rest[j]] for j in _spaced(logs, high))]


def _spaced(logs: list[float], gap: float) -> list[int]:
    """Indexes into `logs` kept walking up it: the first, then each at least `gap` above the last
    kept, and the last always (it replaces a kept point closer than `gap` below it)."""
    kept = [0]
    for j in range(1, len(logs)):
        if logs[j] - logs[kept[-1]] >= gap:
            kept.append(j)
    if kept[-1] != len(logs) - 1:
        if len(kept) > 1:
            kept[-1] = len(logs) - 1
        else:
            kept.append(len(logs) - 1)
    return kept


class RunStatus:
    """One ScaleRLRun's status subresource."""

    def __init__(self, kube: Kube, namespace: str, name: str, attempts: int = 5) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.attempts = attempts

    def read(self) -> dict[str, Any]:
        """The whole run, as the status subresource serves it."""
        return dict(
            retrying(
                lambda: self.kube.get(API_VERSION, KIND, self.namespace, self.name, "status"),
                attempts=self.attempts,
            )
        )

    def merge(self, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch status fields only this writer owns (lists are replaced whole); the run
        as written."""
        return dict(
            retrying(
                lambda: self.kube.patch(
                    API_VERSION, KIND, self.namespace, self.name, {"status": status}, sub="status"
                ),
                attempts=self.attempts,
            )
        )

    def update(self, change: Change) -> dict[str, Any] | None:
        """Read, let `change(run)` say which status fields to set (None: nothing), and write them
        only if nobody wrote in between (a JSON patch that tests resourceVersion); else again.

        For fields several writers share, such as the conditions list.
        """

        def attempt() -> dict[str, Any] | None:
            run = self.read()
            fields = change(run)
            if not fields:
                return None
            ops = _json_patch(run, fields)
            self.kube.patch(
                API_VERSION, KIND, self.namespace, self.name, ops, sub="status", json_patch=True
            )
            return fields

        return retrying(attempt, attempts=self.attempts, conflicts=True)


def _json_patch(run: dict[str, Any], fields: dict[str, Any]) -> list[dict[str, Any]]:
    version = run["metadata"]["resourceVersion"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version}
    ]
    status = run.get("status")
    if not isinstance(status, dict):
        value = {k: v for k, v in fields.items() if v is not None}
        return [*ops, {"op": "add", "path": "/status", "value": value}]
    for key, value in fields.items():
        if value is not None:
            ops.append({"op": "add", "path": f"/status/{key}", "value": value})  # add replaces
        elif key in status:
            ops.append({"op": "remove", "path": f"/status/{key}"})
    return ops


# At most this many given-up generators wait in the status for the operator at once.
GIVEN_UP_KEPT = 20


def given_up_change(entry: dict[str, Any]) -> Change:
    """A `RunStatus.update` change that adds `entry` to status.generatorsGivenUp."""

    def change(run: dict[str, Any]) -> dict[str, Any] | None:
        current = list((run.get("status") or {}).get("generatorsGivenUp") or [])
        return {"generatorsGivenUp": [*current, entry][-GIVEN_UP_KEPT:]}

    return change


def conditions_change(type_: str, status: bool, reason: str, message: str) -> Change:
    """A `RunStatus.update` change that sets one condition (None when it is already so)."""

    def change(run: dict[str, Any]) -> dict[str, Any] | None:
        current = list((run.get("status") or {}).get("conditions") or [])
        updated = set_condition(current, type_, status, reason, message)
        return None if updated == current else {"conditions": updated}

    return change


class KubernetesStatus:
    """StatusSink writing the run's status through the API (and its files on the volume)."""

    def __init__(
        self, status: RunStatus, local: FileStatus | None = None, keep: int = EVALUATIONS_KEPT
    ) -> None:
        self.status = status
        self.local = local  # a FileStatus on the run directory, or None
        self.keep = keep
        self.evaluations: list[dict[str, Any]] = []
        self.generators: int | None = None  # spec.generators.replicas as last written beside

    @classmethod
    def from_target(cls, target: str, run_dir: Path) -> KubernetesStatus:
        """`target` is "<namespace>/<name>"; credentials as kubectl finds them."""
        namespace, _, name = target.partition("/")
        if not namespace or not name or "/" in name:
            raise InputError(f"status target {target!r} is not kubernetes:<namespace>/<name>")
        return cls(RunStatus(Kube.connect(), namespace, name), FileStatus(run_dir))

    def restore(self, evaluations: list[dict[str, Any]]) -> None:
        if self.local is not None:
            self.local.restore(evaluations)
        points = (placed(e) for e in evaluations)
        self.evaluations = [p for p in points if p is not None]
        self._write("restore", self._evaluation_fields())

    def progress(self, progress: Progress) -> None:
        if self.local is not None:
            self.local.progress(progress)
        self._write("progress", {"progress": status_progress(progress)})

    def evaluation(
        self, row: HistoryRow, scores: list[PromptScore], completions: list[dict[str, Any]]
    ) -> None:
        if self.local is not None:
            self.local.evaluation(row, scores, completions)
        point = placed(row.to_dict())
        if point is None:
            return
        self.evaluations.append(point)
        fields = self._evaluation_fields()
        fields["progress"] = {"evalPassRate": self.evaluations[-1]["passRate"]}
        self._write("evaluation", fields)

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        if self.local is not None:
            self.local.condition(type_, status, reason, message)
        try:
            self.status.update(conditions_change(type_, status, reason, message))
        except KubeError as err:
            log.warning("status: condition %s not written: %s", type_, err)

    def _evaluation_fields(self) -> dict[str, Any]:
        return {
            "evaluations": thin(self.evaluations, self.keep),
            "evaluationCount": len(self.evaluations),
        }

    def gave_up(self, generator: int, pid: int | None, host: str | None, reason: str) -> None:
        if self.local is not None:
            self.local.gave_up(generator, pid, host, reason)
        if not host:
            return
        entry = {"index": generator, "pod": host, "reason": reason}
        try:  # the operator deletes the pod (a frozen one reads no Stop) and clears the entry
            self.status.update(given_up_change(entry))
        except KubeError as err:
            log.warning("status: generator %d given up, not written: %s", generator, err)

    def desired_generators(self) -> int | None:
        return self.generators

    def _write(self, what: str, fields: dict[str, Any]) -> None:
        try:
            run = self.status.merge(fields)
        except KubeError as err:
            log.warning("status: %s not written: %s", what, err)
            return
        replicas = ((run.get("spec") or {}).get("generators") or {}).get("replicas")
        if isinstance(replicas, int) and not isinstance(replicas, bool):
            self.generators = replicas
