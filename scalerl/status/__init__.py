"""The status sink: where a run's progress, evaluations and conditions go.

One interface, two ends. Locally (`FileStatus`) it writes `history.jsonl`, `progress.json` and
`status.json` in the run directory; in a cluster (`scalerl.status.kubernetes`) it patches the
ScaleRLRun's status subresource with the run's own ServiceAccount. The trainer reports through
`StatusSink` and does not know which end it has; `open_status` picks it from the environment
contract (`ProcessEnv.status`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from scalerl.errors import InputError
from scalerl.status.conditions import Condition, set_condition
from scalerl.status.files import FileStatus
from scalerl.status.history import HistoryRow, Progress, PromptScore

KUBERNETES = "kubernetes:"

__all__ = ["Condition", "FileStatus", "StatusSink", "open_status", "set_condition"]


class StatusSink(Protocol):
    def restore(self, evaluations: list[dict[str, Any]]) -> None:
        """After a resume: the evaluation history is exactly `evaluations` (later ones dropped)."""

    def progress(self, progress: Progress) -> None:
        """The run's live progress (step, compute, last step's metrics)."""

    def evaluation(
        self, row: HistoryRow, scores: list[PromptScore], completions: list[dict[str, Any]]
    ) -> None:
        """One new held-out evaluation: its history row, what each prompt scored, and the
        completions kept for a person to read."""

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        """Set one condition (metav1.Condition shape, keyed by type)."""

    def gave_up(self, generator: int, pid: int | None, host: str | None, reason: str) -> None:
        """The trainer gave generator `generator` up (process `pid` on `host`, as it said hello)
        while it looked alive: its supervisor ends it, and so starts its replacement (the local
        runner reads GAVE_UP_FILE; the operator, status.generatorsGivenUp)."""

    def desired_generators(self) -> int | None:
        """How many generators the run asks for now, where that changes while it runs (a
        cluster's `kubectl scale srl`), as of the last write; None: as its spec said at the
        start (a local run scales on resume)."""


def open_status(target: str, run_dir: Path) -> StatusSink:
    """`files` (local runs) or `kubernetes:<namespace>/<name>` (pods of the operator)."""
    if target == "files":
        return FileStatus(run_dir)
    if target.startswith(KUBERNETES):
        from scalerl.status.kubernetes import KubernetesStatus

        return KubernetesStatus.from_target(target.removeprefix(KUBERNETES), run_dir)
    raise InputError(f"status target {target!r} is not 'files' or 'kubernetes:<namespace>/<name>'")
