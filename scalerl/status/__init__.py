"""The status sink: where a run's progress, evaluations and conditions go.

One interface, two ends. Locally (`FileStatus`) it writes `history.jsonl`, `progress.json` and
`status.json` in the run directory; in a cluster (`scalerl.status.kubernetes`) it patches the
ScaleRLRun's status subresource with the run's own ServiceAccount. The trainer reports through
`StatusSink` and does not know which end it has; `open_status` picks it from the environment
contract (`ProcessEnv.status`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from scalerl.errors import InputError
from scalerl.status.conditions import Condition, set_condition

if TYPE_CHECKING:
    from scalerl.status.files import FileStatus

KUBERNETES = "kubernetes:"

__all__ = ["Condition", "FileStatus", "StatusSink", "open_status", "set_condition"]


class StatusSink(Protocol):
    def restore(self, evaluations: list[dict[str, Any]]) -> None:
        """After a resume: the evaluation history is exactly `evaluations` (later ones dropped)."""

    def progress(self, progress: dict[str, Any]) -> None:
        """The run's live progress (step, compute, last batch's metrics)."""

    def evaluation(self, entry: dict[str, Any]) -> None:
        """One new held-out evaluation (step, compute, pass_rate, ...)."""

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        """Set one condition (metav1.Condition shape, keyed by type)."""


def open_status(target: str, run_dir: Path) -> StatusSink:
    """`files` (local runs) or `kubernetes:<namespace>/<name>` (pods of the operator)."""
    if target == "files":
        from scalerl.status.files import FileStatus

        return FileStatus(run_dir)
    if target.startswith(KUBERNETES):
        from scalerl.status.kubernetes import KubernetesStatus

        return KubernetesStatus.from_target(target.removeprefix(KUBERNETES), run_dir)
    raise InputError(f"status target {target!r} is not 'files' or 'kubernetes:<namespace>/<name>'")


def __getattr__(name: str) -> Any:
    # FileStatus reuses the trainer's file code, whose package imports torch: load it only when
    # asked, so the operator and the fit Job can use the conditions and the cluster end without.
    if name == "FileStatus":
        from scalerl.status.files import FileStatus

        return FileStatus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
