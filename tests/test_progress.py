"""The progress line of a local run: every number says what it is, compute with its unit."""

from __future__ import annotations

import pytest

from scalerl.progress import ProgressDisplay, describe

PROGRESS = {
    "step": 7,
    "eval_pass_rate": 0.52,
    "compute": 0.0237,
    "train": {"pass_rate": 0.4, "truncation_rate": 0.031, "policy_lag": 1.5, "entropy": 0.82},
}


def test_the_line_names_the_runs_compute_unit() -> None:
    # Three processes for 28 s of training are 0.0237 process-hours, not 0.0237 hours.
    line = describe(PROGRESS, "process-hours")
    assert line == (
        "held-out 0.52  train 0.40  trunc 3.1%  lag 1.5  entropy 0.82  compute 0.0237 process-hours"
    )
    assert describe(PROGRESS, "GPU-hours").endswith("compute 0.0237 GPU-hours")


def test_a_number_not_yet_known_is_left_out() -> None:
    assert describe({"step": 0, "compute": 0.0}, "process-hours") == "compute 0 process-hours"


def test_the_plain_line_carries_the_unit(capsys: pytest.CaptureFixture[str]) -> None:
    display = ProgressDisplay(100, unit="GPU-hours")  # not a terminal: plain lines
    display.update(PROGRESS)
    assert "step 7/100" in capsys.readouterr().err
    display.last_plain = 0.0
    display.update(PROGRESS)
    assert capsys.readouterr().err.rstrip().endswith("compute 0.0237 GPU-hours")
