"""Metrics: every name DESIGN.md promises is exported, with the namespace and run labels, over
HTTP (DESIGN.md, "Metrics": "labels `namespace` and `run`")."""

from __future__ import annotations

import urllib.request

from scalerl.metrics import (
    GENERATOR_GAUGES,
    RUN_GAUGES,
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
    if isinstance(metrics, TrainerMetrics):  # a run of two domains
        rate = {"pass_rate": 0.5, "pass_rate_se": 0.1}
        metrics.set_domain_pass_rates({"math": rate, "code": rate})
        figures = {"kl": 1e-4, "abs_mean": 0.01, "abs_max": 0.2, "outside": 0.0, "tokens": 80}
        metrics.set_mismatch({0: figures, 1: figures})  # a step with tokens of two lags
    return metrics


def run_metrics(run: str, namespace: str = "team-a") -> RunMetrics:
    """The runner's (or operator's) gauges once a run (a sweep's variant) has a fit, a target
    and a restart."""
    metrics = RunMetrics()
    fit = {"A": 0.8, "B": 1.5, "C_mid": 120.0, "R0": 0.1, "predictedAtBudget": 0.7}
    metrics.set_prediction(namespace, run, fit)
    metrics.set_targets(namespace, run, pass_rate=0.75, stop_below=0.5)
    metrics.set_restarts(namespace, run, 1)
    metrics.set_sweep_stopped(namespace, run, False)
    return metrics


def test_every_design_metric_is_served_by_some_process() -> None:
    text = scrape(
        in_use(TrainerMetrics("team-a", "demo")),
        in_use(GeneratorMetrics("team-a", "demo")),
        run_metrics("demo"),
    )
    for name in DESIGN_NAMES:
        series = f"scalerl_{name}"
        if name.endswith("_seconds"):
            series += "_count"
        assert f'{series}{{namespace="team-a",run="demo"}}' in text, series


def test_all_metric_names_lists_what_is_served() -> None:
    operator = run_metrics("x")  # and a finished run's scored prediction, made at 20 % of it
    scored = {"fractionSeen": 0.2, "compute": 1.0, "error": 0.01, "inside": True, "width": 0.1}
    operator.track_record.set_run("ns", "x", [scored])
    text = scrape(in_use(TrainerMetrics("ns", "x")), in_use(GeneratorMetrics("ns", "x")), operator)
    served = {line.split("{")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert served == all_metric_names()


def test_values_land_in_the_run_series() -> None:
    trainer = TrainerMetrics("research", "math-8b")
    trainer.zero_variance_groups.inc(3)
    trainer.step_seconds.observe(0.4)
    text = scrape(trainer)
    assert 'scalerl_zero_variance_groups_total{namespace="research",run="math-8b"} 3.0' in text
    assert 'scalerl_step_seconds_count{namespace="research",run="math-8b"} 1.0' in text


def test_run_gauges_keep_one_series_per_run_until_it_is_forgotten() -> None:
    metrics = run_metrics("a")
    metrics.set_prediction("team-a", "b", {"A": 0.6, "B": 2.0, "C_mid": 50.0, "R0": 0.0})
    metrics.forget("team-a", "a")
    text = scrape(metrics)
    assert 'scalerl_predicted_asymptote{namespace="team-a",run="b"} 0.6' in text
    assert 'run="a"' not in text
    # b has no targets
    assert 'scalerl_target_pass_rate{namespace="team-a",run="b"}' not in text
    assert 'scalerl_stop_asymptote_below{namespace="team-a",run="b"}' not in text


def test_a_gauge_is_served_once_set_and_a_counter_from_the_start() -> None:
    trainer = TrainerMetrics("local", "r")
    before = scrape(trainer)
    series = '{namespace="local",run="r"}'
    assert f"scalerl_eval_pass_rate{series}" not in before  # no evaluation yet: no false 0
    assert f"scalerl_no_signal_steps_total{series} 0.0" in before  # rates need the first 0
    trainer.eval_pass_rate.set(0.25)
    assert f"scalerl_eval_pass_rate{series} 0.25" in scrape(trainer)


# --- one run per (namespace, name) -------------------------------------------------------------


def test_same_named_runs_in_two_namespaces_keep_their_own_process_series() -> None:
    # Two runs named foo, in team-a and team-b, each with its trainer and generator.
    a, b = TrainerMetrics("team-a", "foo"), TrainerMetrics("team-b", "foo")
    a.step.set(10)
    b.step.set(20)
    GeneratorMetrics("team-a", "foo", alongside=a).generated_sequences.inc(3)
    GeneratorMetrics("team-b", "foo", alongside=b).generated_sequences.inc(5)
    text = scrape(a, b)
    assert 'scalerl_step{namespace="team-a",run="foo"} 10.0' in text
    assert 'scalerl_step{namespace="team-b",run="foo"} 20.0' in text
    assert 'scalerl_generated_sequences_total{namespace="team-a",run="foo"} 3.0' in text
    assert 'scalerl_generated_sequences_total{namespace="team-b",run="foo"} 5.0' in text


def test_same_named_runs_in_two_namespaces_keep_separate_run_series() -> None:
    metrics = RunMetrics()
    for namespace, a, target, restarts in (("team-a", 0.8, 0.5, 1), ("team-b", 0.6, 0.7, 3)):
        fit = {"A": a, "B": 1.0, "C_mid": 10.0, "R0": 0.1, "predictedAtBudget": a - 0.1}
        metrics.set_prediction(namespace, "foo", fit)
        metrics.set_targets(namespace, "foo", pass_rate=target, stop_below=target - 0.1)
        metrics.set_restarts(namespace, "foo", restarts)
        metrics.set_sweep_stopped(namespace, "foo", namespace == "team-b")

    def sample(name: str, namespace: str) -> float | None:
        labels = {"namespace": namespace, "run": "foo"}
        return metrics.registry.get_sample_value(f"scalerl_{name}", labels)

    both = {
        name: (sample(name, "team-a"), sample(name, "team-b"))
        for name in (
            "predicted_asymptote",
            "target_pass_rate",
            "stop_asymptote_below",
            "gang_restarts",
            "sweep_variant_stopped",
        )
    }
    assert both == {
        "predicted_asymptote": (0.8, 0.6),
        "target_pass_rate": (0.5, 0.7),
        "stop_asymptote_below": (0.4, 0.6),
        "gang_restarts": (1, 3),
        "sweep_variant_stopped": (0, 1),
    }
    # Deleting foo in team-a takes its series only.
    metrics.forget("team-a", "foo")
    for name in RUN_GAUGES:
        assert sample(name, "team-a") is None, name
        assert sample(name, "team-b") is not None, name


# --- what each gauge means ------------------------------------------------------------------


def test_an_evaluation_exports_its_compute_and_standard_error_beside_its_pass_rate() -> None:
    # The pass-rate-vs-compute panel plots eval_pass_rate against eval_compute_hours: the
    # compute at which that evaluation was measured, not the compute now.
    assert {"eval_compute_hours", "eval_pass_rate_stderr"} <= set(TRAINER_GAUGES)
    trainer = TrainerMetrics("team-a", "r")
    trainer.eval_pass_rate.set(0.25)
    trainer.eval_pass_rate_stderr.set(0.02)
    trainer.eval_compute_hours.set(1.5)
    trainer.compute_hours.set(2.0)  # training went on after the evaluation
    text = scrape(trainer)
    series = '{namespace="team-a",run="r"}'
    assert f"scalerl_eval_compute_hours{series} 1.5" in text
    assert f"scalerl_eval_pass_rate_stderr{series} 0.02" in text
    assert "GPU-hours; process-hours for a CPU run" in TRAINER_GAUGES["eval_compute_hours"]
    assert "per-prompt means" in TRAINER_GAUGES["eval_pass_rate_stderr"]


def test_help_texts_say_which_pass_rate_and_which_lag() -> None:
    # "Pass" has one definition for training samples (trainer/batch.py): reward > 0 and not
    # truncated; the held-out one is mean@k. The lag is over the batch actually trained on.
    assert "reward > 0 and not truncated" in TRAINER_GAUGES["pass_rate"]
    assert TRAINER_GAUGES["pass_rate"].startswith("Train pass rate")
    assert "mean@k" in TRAINER_GAUGES["eval_pass_rate"]
    assert "trained batch" in TRAINER_GAUGES["policy_lag_steps"]


def test_the_target_is_the_pass_rate_the_run_should_end_at() -> None:
    # One meaning of "target" (spec.budget.targetPassRate), set beside the pass rate the fit
    # predicts where the run will end; the stopWhen threshold is a gauge of its own name.
    metrics = RunMetrics()
    fit = {"A": 0.8, "B": 1.5, "C_mid": 120.0, "R0": 0.1, "predictedAtBudget": 0.62}
    metrics.set_prediction("team-a", "r", fit)
    metrics.set_targets("team-a", "r", pass_rate=0.7, stop_below=0.5)
    text = scrape(metrics)
    series = '{namespace="team-a",run="r"}'
    assert f"scalerl_predicted_at_budget{series} 0.62" in text
    assert f"scalerl_target_pass_rate{series} 0.7" in text
    assert f"scalerl_stop_asymptote_below{series} 0.5" in text
    assert "targetPassRate" in RUN_GAUGES["target_pass_rate"]
    assert "predictedAtBudget" in RUN_GAUGES["predicted_at_budget"]
    # A target dropped from the spec takes its gauge with it.
    metrics.set_targets("team-a", "r", pass_rate=None, stop_below=None)
    text = scrape(metrics)
    assert "scalerl_target_pass_rate{" not in text and "scalerl_stop_asymptote_below{" not in text


def test_the_trainer_counts_the_groups_it_received_beside_the_stale_ones() -> None:
    # The lag alert's share: stale groups over received groups.
    trainer = TrainerMetrics("team-a", "r")
    trainer.received_groups.inc(16)
    trainer.stale_groups.inc(9)
    text = scrape(trainer)
    assert 'scalerl_received_groups_total{namespace="team-a",run="r"} 16.0' in text
    assert 'scalerl_stale_groups_total{namespace="team-a",run="r"} 9.0' in text


def test_mismatch_is_served_per_lag_and_a_lag_the_last_step_lacked_is_gone() -> None:
    trainer = TrainerMetrics("research", "math-8b")
    figures = {"kl": 2e-4, "abs_mean": 0.01, "abs_max": 0.3, "outside": 0.05, "tokens": 120}
    trainer.set_mismatch({0: figures, 2: {**figures, "kl": 0.04}})
    text = scrape(trainer)
    run = 'namespace="research",run="math-8b"'  # the exposition sorts labels by name
    assert f'scalerl_mismatch_kl{{lag="0",{run}}} 0.0002' in text
    assert f'scalerl_mismatch_kl{{lag="2",{run}}} 0.04' in text
    assert f'scalerl_mismatch_ratio_outside_fraction{{lag="0",{run}}} 0.05' in text

    trainer.set_mismatch({0: {**figures, "kl": 1e-4}})  # the next step trained on lag 0 alone
    text = scrape(trainer)
    assert f'scalerl_mismatch_kl{{lag="0",{run}}} 0.0001' in text
    assert 'lag="2"' not in text
