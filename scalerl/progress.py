"""The live progress display of a local run: step, pass rates, truncation, policy lag, ETA.

On a terminal it is a rich progress bar; elsewhere (CI, a pipe) one plain line per step change
at most every few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_EVERY_S = 10.0


def describe(progress: dict[str, Any], unit: str) -> str:
    """progress.json (`scalerl.status.history.Progress`) in one line; `unit` is the run's compute
    unit (`RunSpec.compute_unit`): process-hours are not wall hours, so the line names it."""
    train = progress.get("train") or {}
    parts = []
    for value, label, fmt in (
        (progress.get("eval_pass_rate"), "held-out", "{:.2f}"),
        (train.get("pass_rate"), "train", "{:.2f}"),
        (train.get("truncation_rate"), "trunc", "{:.1%}"),
        (train.get("policy_lag"), "lag", "{:.1f}"),
        (train.get("entropy"), "entropy", "{:.2f}"),
        (progress.get("compute"), "compute", "{:.3g} " + unit),
    ):
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return "  ".join(parts)


class ProgressDisplay:
    def __init__(self, total_steps: int, *, unit: str, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self.enabled = enabled
        self.total = total_steps
        self.unit = unit
        self.bar = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.bar.add_task("run", total=total_steps, info="starting processes...")
        self.last_plain = 0.0
        self.last_no_signal: str | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live:
            self.bar.stop()

    def update(self, progress: dict[str, Any]) -> None:
        no_signal = progress.get("no_signal")
        if no_signal and no_signal != self.last_no_signal:  # said at once, not at the next tick
            self.note(f"step {progress.get('step', 0)}: {no_signal}")
        self.last_no_signal = no_signal
        info = describe(progress, self.unit)
        if self.live:
            self.bar.update(self.task, completed=progress.get("step", 0), info=info)
        elif self.enabled and time.monotonic() - self.last_plain >= PLAIN_EVERY_S:
            self.last_plain = time.monotonic()
            print(
                f"step {progress.get('step', 0)}/{self.total}  {info}", file=sys.stderr, flush=True
            )

    def note(self, text: str) -> None:
        """Events (restarts, fits) are always shown, with or without the progress display."""
        if self.live:
            self.bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)
