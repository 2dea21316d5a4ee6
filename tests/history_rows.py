"""History rows, scores and progress as the trainer records them, for tests of their readers
(status sinks, the fit, the operator), and the check every recorded history must pass."""

from __future__ import annotations

from pathlib import Path

from scalerl.status.history import (
    HeldOut,
    HistoryRow,
    Progress,
    PromptScore,
    TrainSummary,
    read_jsonl,
)


def scored(pass_rate: float, prompts: int = 25, k: int = 4) -> list[PromptScore]:
    """Per-prompt scores whose mean@k is `pass_rate` rounded to a whole number of samples."""
    correct = round(pass_rate * prompts * k)
    return [PromptScore(f"val/{i}", k, min(k, max(0, correct - i * k)), 0) for i in range(prompts)]


def history_row(step: int, compute: float, pass_rate: float = 0.3) -> HistoryRow:
    """One evaluation as the trainer records it (100 held-out samples)."""
    return HistoryRow.of(
        step=step,
        version=step,
        compute=compute,
        time=1.7e9 + step,
        held_out=HeldOut.of(scored(pass_rate)),
        train=TrainSummary(pass_rate=0.5, truncation_rate=0.01, policy_lag=1.0, loss=0.1),
        counters={},
        trainer_seconds={},
        generation={},
    )


def progress_at(step: int, compute: float = 0.0, train_pass_rate: float = 0.4) -> Progress:
    """The trainer's progress after `step`."""
    return Progress(
        step=step,
        version=step,
        compute=compute,
        max_steps=100,
        time=1.7e9 + step,
        train=TrainSummary(pass_rate=train_pass_rate, truncation_rate=0.01, policy_lag=1.0),
        eval_pass_rate=None,
        no_signal=None,
    )


def impossible_rows(history: Path) -> list[str]:
    """Rows of a history file whose held-out pass rate is not a whole number of correct samples
    out of `eval_samples` (the README: `pass_rate` is correct / samples of that evaluation)."""
    bad = []
    for row in read_jsonl(history):
        samples, correct = row["eval_samples"], row["eval_correct"]
        if row["pass_rate"] != correct / samples or not 0 <= correct <= samples:
            bad.append(f"{history}: step {row['step']}: {row['pass_rate']} of {samples} samples")
    return bad
