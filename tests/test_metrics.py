"""Metrics: every name DESIGN.md promises is exported, with the run label, over HTTP."""

from __future__ import annotations

import urllib.request

from scalerl.local import free_port
from scalerl.metrics import GeneratorMetrics, RunnerMetrics, TrainerMetrics, all_metric_names

DESIGN_NAMES = [
    "truncated_sequences_total",
    "generated_sequences_total",
    "entropy",
    "pass_rate",
    "eval_pass_rate",
    "policy_version",
    "policy_lag_steps",
    "generated_tokens_total",
    "trained_tokens_total",
    "weight_sync_seconds",
    "step_seconds",
    "compute_hours",
    "zero_variance_groups_total",
    "curriculum_dropped_prompts",
    "predicted_asymptote",
    "predicted_cmid",
]


def scrape(*processes: TrainerMetrics | GeneratorMetrics | RunnerMetrics) -> str:
    text = ""
    for metrics in processes:
        port = free_port()
        metrics.serve(port, addr="127.0.0.1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text += response.read().decode()
    return text


def test_every_design_metric_is_served_by_some_process() -> None:
    text = scrape(TrainerMetrics("demo"), GeneratorMetrics("demo"), RunnerMetrics("demo"))
    for name in DESIGN_NAMES:
        series = f"scalerl_{name}"
        if name.endswith("_seconds"):
            series += "_count"
        assert f'{series}{{run="demo"}}' in text, series


def test_all_metric_names_lists_what_is_served() -> None:
    text = scrape(TrainerMetrics("x"), GeneratorMetrics("x"), RunnerMetrics("x"))
    served = {line.split("{")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert served == all_metric_names()


def test_values_land_in_the_run_series() -> None:
    trainer = TrainerMetrics("math-8b")
    trainer.zero_variance_groups.inc(3)
    trainer.step_seconds.observe(0.4)
    text = scrape(trainer)
    assert 'scalerl_zero_variance_groups_total{run="math-8b"} 3.0' in text
    assert 'scalerl_step_seconds_count{run="math-8b"} 1.0' in text
