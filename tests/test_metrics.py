"""Metrics: every name DESIGN.md promises is exported, with the run label, over HTTP."""

from __future__ import annotations

import urllib.request

from scalerl.metrics import (
    GENERATOR_GAUGES,
    TRAINER_GAUGES,
    GeneratorMetrics,
    RunMetrics,
    TrainerMetrics,
    all_metric_names,
)
from scalerl.ports import free_port

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


def scrape(*processes: TrainerMetrics | GeneratorMetrics | RunMetrics) -> str:
    text = ""
    for metrics in processes:
        port = free_port()
        metrics.serve(port, addr="127.0.0.1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text += response.read().decode()
    return text


def in_use(metrics: TrainerMetrics | GeneratorMetrics) -> TrainerMetrics | GeneratorMetrics:
    """A process's metrics once it has set every gauge (a gauge is served from its first set)."""
    for name in (*TRAINER_GAUGES, *GENERATOR_GAUGES):
        if hasattr(metrics, name):
            getattr(metrics, name).set(1.0)
    return metrics


def run_metrics(run: str) -> RunMetrics:
    """The runner's (or operator's) gauges once a run has a fit, a target and a restart."""
    metrics = RunMetrics()
    metrics.set_prediction(run, {"A": 0.8, "B": 1.5, "C_mid": 120.0, "R0": 0.1})
    metrics.set_target(run, 0.5)
    metrics.set_restarts(run, 1)
    return metrics


def test_every_design_metric_is_served_by_some_process() -> None:
    text = scrape(
        in_use(TrainerMetrics("demo")), in_use(GeneratorMetrics("demo")), run_metrics("demo")
    )
    for name in DESIGN_NAMES:
        series = f"scalerl_{name}"
        if name.endswith("_seconds"):
            series += "_count"
        assert f'{series}{{run="demo"}}' in text, series


def test_all_metric_names_lists_what_is_served() -> None:
    text = scrape(in_use(TrainerMetrics("x")), in_use(GeneratorMetrics("x")), run_metrics("x"))
    served = {line.split("{")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert served == all_metric_names()


def test_values_land_in_the_run_series() -> None:
    trainer = TrainerMetrics("math-8b")
    trainer.zero_variance_groups.inc(3)
    trainer.step_seconds.observe(0.4)
    text = scrape(trainer)
    assert 'scalerl_zero_variance_groups_total{run="math-8b"} 3.0' in text
    assert 'scalerl_step_seconds_count{run="math-8b"} 1.0' in text


def test_run_gauges_keep_one_series_per_run_until_it_is_forgotten() -> None:
    metrics = run_metrics("a")
    metrics.set_prediction("b", {"A": 0.6, "B": 2.0, "C_mid": 50.0, "R0": 0.0})
    metrics.forget("a")
    text = scrape(metrics)
    assert 'scalerl_predicted_asymptote{run="b"} 0.6' in text
    assert 'run="a"' not in text
    assert 'scalerl_target_asymptote{run="b"}' not in text  # b has no stopWhen target


def test_a_gauge_is_served_once_set_and_a_counter_from_the_start() -> None:
    trainer = TrainerMetrics("r")
    before = scrape(trainer)
    assert 'scalerl_eval_pass_rate{run="r"}' not in before  # no evaluation yet: no false 0
    assert 'scalerl_no_signal_steps_total{run="r"} 0.0' in before  # rates need the first 0
    trainer.eval_pass_rate.set(0.25)
    assert 'scalerl_eval_pass_rate{run="r"} 0.25' in scrape(trainer)
