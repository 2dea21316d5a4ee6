"""Prometheus metrics: every name the processes export, the chart's rules and dashboards use, in
one place.

Prefix `scalerl_`, labels `namespace` and `run` on every series (two runs of one name in two
namespaces are two series; a local run's namespace is "local"), but the operator's track record,
which pools the finished runs it manages (label `seen` alone: TRACK_RECORD_GAUGES); units in
names; counters end in `_total` (prometheus-client appends it). Each process builds the set it
owns on its own registry and serves `/metrics` on its port.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from scalerl.status.history import REWARD_ERROR, ROLLOUT_FAILED, SANDBOX

# `*_created` series double the series count and nothing of ours reads them.
disable_created_metrics()

# The unit of every compute a run reports, for texts that cannot know which run they describe
# (help texts, the CRD, the dashboard): `RunSpec.compute_unit` is one run's.
COMPUTE_UNIT = "GPU-hours; process-hours for a CPU run"

PREFIX = "scalerl_"
LABELS = ("namespace", "run")
_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# name (without prefix and without the _total counters get) -> help text. The chart's tests read
# this table, so a name used in a rule or dashboard must be here.
GENERATOR_COUNTERS = {
    "generated_sequences": "Completions generated (train rollouts).",
    "truncated_sequences": "Completions that hit the hard length limit.",
    "interrupted_sequences": "Completions cut by the forced length interruption.",
    "generated_tokens": "Completion tokens generated.",
    "generator_idle_seconds": "Seconds a generator waited with nothing to generate.",
    "generator_reward_wait_seconds": "Seconds a generator's engine had nothing to generate "
    "because every group in flight was waiting for its rewards (code tests).",
    "weight_sync_failures": "Weight updates that failed; the previous version stayed loaded.",
    "code_tests": "Tests the code reward ran (each test case of a completion's program).",
    "code_test_timeouts": "Code tests that ran out of their time (testTimeoutSeconds).",
    "sandbox_failures": (
        "Completions the code sandbox itself failed to run (no bubblewrap, the host out of"
        " memory): not trained on; in an evaluation unscored, counted as not passed."
    ),
    "reward_errors": (
        "Completions whose reward function or environment rubric raised: scored as failed"
        " (never passed), in training too; in an evaluation unscored, counted as not passed."
    ),
    # spec.environment's multi-turn rollouts (scalerl.agents); per rollout: over
    # generated_sequences.
    "agent_turns": "Model turns of multi-turn rollouts (spec.environment).",
    "tool_calls": "Tool calls the model made in its rollouts.",
    "tool_errors": "Tool calls that failed (raised, timed out, unknown tool); the model read why.",
    "environment_seconds": "Seconds the environment took to answer the model (its tools too).",
    "environment_failures": (
        "Rollouts dropped because the environment failed them (raised, ran past its time, the"
        " model never took a turn): not trained on; in an evaluation unscored, counted as not"
        " passed. A rubric that raises is a reward error (reward_errors)."
    ),
}
GENERATOR_GAUGES = {
    "generator_policy_version": "Policy version loaded in this generator.",
}
TRAINER_COUNTERS = {
    "trained_tokens": "Completion tokens trained on (loss tokens).",
    "generator_replacements": (
        "Generators that joined mid-run in place of one that was lost (no gang restart)."
    ),
    "generators_degraded_seconds": (
        "Seconds the trainer trained or waited with fewer generators than the run asks for (one"
        " lost, its replacement starting)."
    ),
    "degraded_steps": "Steps trained with fewer generators than the run asks for.",
    "zero_variance_groups": "Prompt groups dropped because all rewards were equal.",
    "received_groups": "Prompt groups the trainer received for its batches, stale ones included.",
    "stale_groups": "Prompt groups dropped for being more than k policy versions old.",
    "skipped_steps": "Optimizer steps skipped for a non-finite loss or gradient.",
    "no_signal_steps": "Steps whose every group was filtered out (all right or all wrong).",
    "tracker_dropped_records": (
        "Experiment-tracker records dropped from memory because a tracker fell behind (slow or"
        " down); the run's tracking journal keeps them and a restart sends them."
    ),
    "tracker_failed_records": (
        "Experiment-tracker records given up after every retry (the tracker refused or was down)."
    ),
}
# scalerl.status.history's reasons a held-out sample went unscored -> the gauge counting them.
UNSCORED_GAUGES = {
    SANDBOX: "eval_unscored_sandbox",
    REWARD_ERROR: "eval_unscored_reward_errors",
    ROLLOUT_FAILED: "eval_unscored_rollouts_failed",
}
TRAINER_GAUGES = {
    "entropy": "Mean token entropy (nats) of the last training batch.",
    "generators_desired": "spec.generators.replicas: the generators the run asks for.",
    "generators_ready": (
        "Generators in the weight-sync group now, sampling on the trainer's weights; below "
        "spec.generators.replicas while a lost one is being replaced."
    ),
    "pass_rate": (
        "Train pass rate of the last batch (reward > 0 and not truncated), over every sample"
        " received for it."
    ),
    "eval_pass_rate": (
        "Held-out pass rate (mean@k) of the last evaluation: passed samples / (prompts x k), an"
        " unscored sample counted as not passed."
    ),
    "eval_unscored": (
        "Samples of the last evaluation that could not be scored (counted as not passed); by"
        " reason in eval_unscored_sandbox, eval_unscored_reward_errors and"
        " eval_unscored_rollouts_failed."
    ),
    "eval_unscored_sandbox": (
        "Samples of the last evaluation the code sandbox itself failed to run (no bubblewrap,"
        " the host out of memory)."
    ),
    "eval_unscored_reward_errors": (
        "Samples of the last evaluation whose reward function or environment rubric raised."
    ),
    "eval_unscored_rollouts_failed": (
        "Rollouts of the last evaluation the environment failed (raised, ran past its time, the"
        " model never took a turn)."
    ),
    "eval_fit_excluded": (
        "1 when the last evaluation is left out of the fit (more than MAX_UNSCORED_FRACTION,"
        " 10 %, of its samples unscored; history.jsonl's fit_excluded says why), else 0."
    ),
    "eval_pass_rate_stderr": (
        "Standard error of eval_pass_rate, from the per-prompt means of that evaluation."
    ),
    "eval_compute_hours": (
        f"Compute ({COMPUTE_UNIT}) at which the last evaluation (eval_pass_rate) was measured."
    ),
    "policy_version": "Policy version of the trainer.",
    "policy_lag_steps": (
        "Mean policy versions between generation and training over the tokens of the last"
        " trained batch (kept samples only)."
    ),
    "compute_hours": f"Compute spent ({COMPUTE_UNIT}).",
    "step": "Optimizer steps taken.",
    "grad_norm": "Total gradient norm (before clipping) of the last step.",
    "importance_ratio_max": "Largest trainer/generator token probability ratio, last step.",
    "clip_fraction": "Fraction of trained tokens whose ratio the loss capped or clipped.",
    "max_off_policy_steps": "The run's maxOffPolicySteps: the policy lag it allows.",
    "weight_sync_bytes": (
        "Bytes of the last policy version handed to the generators (with LoRA: the adapter alone)."
    ),
    "curriculum_dropped_prompts": (
        "Train prompts the run's no-positive-resampling curriculum removed (pass rate >= the"
        " threshold in the latest group a step took)."
    ),
}
# A run of several domains (spec.data.train as sources): each domain's held-out pass rate, labelled
# with `domain` besides the run's labels. Set at each evaluation whose prompts span several.
DOMAIN_LABELS = (*LABELS, "domain")
TRAINER_DOMAIN_GAUGES = {
    "eval_domain_pass_rate": (
        "Held-out pass rate (mean@k) of one domain's prompts at the last evaluation."
    ),
    "eval_domain_pass_rate_stderr": (
        "Standard error of eval_domain_pass_rate, from that domain's per-prompt means."
    ),
}
# Train-inference mismatch of the last step's trained tokens (scalerl.recipe.mismatch), labelled
# with `lag` besides the run's labels: the trainer's version minus the oldest version that
# computed the token (an in-flight update keeps the KV cache). Lag "0" is the engines' numeric
# mismatch alone; a lag absent from the last step has no series.
LAG_LABELS = (*LABELS, "lag")
TRAINER_LAG_GAUGES = {
    "mismatch_kl": (
        "k3 estimate of KL(generator || trainer) over the last step's trained tokens of this"
        " policy lag; lag 0: train-inference mismatch alone."
    ),
    "mismatch_logprob_abs_mean": "Mean |trainer log-prob - generator log-prob| over those tokens.",
    "mismatch_logprob_abs_max": "Largest |trainer - generator log-prob| of those tokens.",
    "mismatch_ratio_outside_fraction": (
        "Fraction of those tokens whose trainer/generator probability ratio leaves [0.8, 1.25]."
    ),
    "mismatch_tokens": "Trained tokens of the last step with this policy lag.",
}
# Lag gauge -> the figure of `scalerl.recipe.mismatch.LagFigures` it shows.
TRAINER_LAG_FIELDS = {
    "mismatch_kl": "kl",
    "mismatch_logprob_abs_mean": "abs_mean",
    "mismatch_logprob_abs_max": "abs_max",
    "mismatch_ratio_outside_fraction": "outside",
    "mismatch_tokens": "tokens",
}
HISTOGRAMS = {
    "weight_sync_seconds": "Seconds to send (trainer) or receive and load (generator) weights.",
    "step_seconds": "Seconds of one optimizer step (forward, backward, update).",
}
GENERATOR_HISTOGRAMS = {
    "code_execution_seconds": "Seconds the code reward took for one completion (all its tests).",
}
# Per run, from whoever watches the run as a whole: the local runner, or the operator (one
# series per run it manages).
RUN_GAUGES = {
    "predicted_asymptote": "Fitted asymptotic pass rate A of the scaling curve.",
    "predicted_cmid": f"Fitted compute midpoint C_mid ({COMPUTE_UNIT}).",
    "predicted_slope": "Fitted scaling exponent B of the scaling curve.",
    "predicted_r0": "Pass rate at zero compute the fit anchors the curve at (R0).",
    "predicted_at_budget": (
        "Fitted pass rate where the run will end: the curve at the first budget it will hit"
        " (predictedAtBudget)."
    ),
    "target_pass_rate": "The run's target: spec.budget.targetPassRate (absent if none).",
    "stop_asymptote_below": (
        "spec.budget.stopWhen.predictedABelow: the run stops once its whole A interval lies"
        " below it (absent if none)."
    ),
    "gang_restarts": "Gang restarts from the last checkpoint so far.",
    "sweep_variant_stopped": "1 once the run's ScaleRLSweep stopped it (a variant whose A "
    "interval lies below the best one's), else 0; absent for a run of no sweep.",
}
# Fit result key -> the gauge it sets: the curve's parameters, then what the run's outlook
# (scalerl.fit.outlook) says of its end.
FIT_GAUGES = {
    "A": "predicted_asymptote",
    "C_mid": "predicted_cmid",
    "B": "predicted_slope",
    "R0": "predicted_r0",
}
OUTLOOK_GAUGES = {"predictedAtBudget": "predicted_at_budget"}
# How good the predictions were (scalerl.fit.track), over every finished run the operator manages
# (status.trackRecord), by the fraction of a run seen when each was made: label `seen`, "0.25",
# "0.5" or "0.75". A run counts by a fraction once it has a scored prediction made by then.
TRACK_RECORD_LABELS = ("seen",)
TRACK_RECORD_GAUGES = {
    "track_record_runs": "Finished runs with a scored prediction made by this fraction of the run.",
    "track_record_coverage": (
        "Share of those runs whose predictedAtBudgetInterval (95 %) held their last evaluation"
        " (of those with an interval)."
    ),
    "track_record_median_error": (
        "Median over those runs of predictedAtBudget minus the last evaluation's pass rate."
    ),
    "track_record_median_width": "Median width of their predictedAtBudgetInterval.",
    "track_record_void": (
        "Runs whose prediction by this fraction was made for another budget than the run ended"
        " under: neither hit nor miss, left out of coverage and errors."
    ),
    "track_record_censored": (
        "Runs stopped by their prediction (budget.stopWhen) with a prediction by this fraction:"
        " they never reached their budget, so they are counted here, not in coverage."
    ),
}
# Track record gauge -> the key of `scalerl.fit.track.summarise`'s rows it reads.
TRACK_RECORD_FIELDS = {
    "track_record_runs": "runs",
    "track_record_coverage": "coverage",
    "track_record_median_error": "medianError",
    "track_record_median_width": "medianWidth",
    "track_record_void": "void",
    "track_record_censored": "censored",
}


def all_metric_names() -> set[str]:
    """Every series name as Prometheus stores it (counters with `_total`, histogram parts)."""
    names = {f"{PREFIX}{n}_total" for n in {**GENERATOR_COUNTERS, **TRAINER_COUNTERS}}
    names |= {f"{PREFIX}{n}" for n in {**GENERATOR_GAUGES, **TRAINER_GAUGES, **RUN_GAUGES}}
    names |= {f"{PREFIX}{n}" for n in {**TRAINER_DOMAIN_GAUGES, **TRAINER_LAG_GAUGES}}
    names |= {f"{PREFIX}{n}" for n in TRACK_RECORD_GAUGES}
    for n in {**HISTOGRAMS, **GENERATOR_HISTOGRAMS}:
        names |= {f"{PREFIX}{n}_{part}" for part in ("bucket", "sum", "count")}
    return names


class _Metrics:
    """A registry of series labelled with one run (its namespace and name); attribute access
    returns the run's child.

    Counters and histograms are served from the start at zero (a rate needs its first sample); a
    gauge only once it is set, so a dashboard shows no held-out pass rate before the first
    evaluation rather than a false 0.
    """

    def __init__(
        self,
        namespace: str,
        run: str,
        counters: dict[str, str],
        gauges: dict[str, str],
        histograms: dict[str, str],
        alongside: _Metrics | None = None,
    ) -> None:
        # `alongside`: share another set's registry (one process serving both roles' series);
        # a histogram both sets have is the other's, observed by both.
        self.registry: CollectorRegistry = (
            alongside.registry if alongside is not None else CollectorRegistry()
        )
        self._labels = {"namespace": namespace, "run": run}
        self._series: dict[str, Any] = {}
        for name, doc in counters.items():
            self._add(name, Counter(PREFIX + name, doc, LABELS, registry=self.registry))
        self._gauges: dict[str, Gauge] = {}
        for name, doc in gauges.items():
            self._gauges[name] = Gauge(PREFIX + name, doc, LABELS, registry=self.registry)
        for name, doc in histograms.items():
            if alongside is not None and name in alongside._series:
                self._series[name] = alongside._series[name]
                continue
            metric = Histogram(
                PREFIX + name, doc, LABELS, registry=self.registry, buckets=_SECONDS_BUCKETS
            )
            self._add(name, metric)

    def _add(self, name: str, metric: Counter | Gauge | Histogram) -> None:
        self._series[name] = metric.labels(**self._labels)

    def __getattr__(self, name: str) -> Any:
        series = self.__dict__.get("_series", {})
        if name not in series and name in self.__dict__.get("_gauges", {}):
            series[name] = self._gauges[name].labels(**self._labels)  # first use: now served
        try:
            return series[name]
        except KeyError:
            raise AttributeError(name) from None

    def serve(self, port: int, addr: str) -> None:
        """Serve `/metrics` on a background thread (port 0: do not serve)."""
        if port:
            start_http_server(port, addr=addr, registry=self.registry)


class GeneratorMetrics(_Metrics):
    def __init__(self, namespace: str, run: str, alongside: TrainerMetrics | None = None) -> None:
        sync = {"weight_sync_seconds": HISTOGRAMS["weight_sync_seconds"], **GENERATOR_HISTOGRAMS}
        super().__init__(namespace, run, GENERATOR_COUNTERS, GENERATOR_GAUGES, sync, alongside)


class TrainerMetrics(_Metrics):
    def __init__(self, namespace: str, run: str) -> None:
        super().__init__(namespace, run, TRAINER_COUNTERS, TRAINER_GAUGES, HISTOGRAMS)
        self._by_domain = {
            name: Gauge(PREFIX + name, doc, DOMAIN_LABELS, registry=self.registry)
            for name, doc in TRAINER_DOMAIN_GAUGES.items()
        }
        self._by_lag = {
            name: Gauge(PREFIX + name, doc, LAG_LABELS, registry=self.registry)
            for name, doc in TRAINER_LAG_GAUGES.items()
        }
        self._lags: set[str] = set()  # the lags of the last step that set them

    def set_unscored(self, unscored: int, reasons: dict[str, int], excluded: bool) -> None:
        """The last evaluation's unscored samples, in all and by reason, and whether the fit
        leaves it out (history.jsonl's eval_unscored, eval_unscored_reasons, fit_excluded)."""
        unknown = set(reasons) - set(UNSCORED_GAUGES)
        if unknown:
            raise ValueError(f"unscored reasons {sorted(unknown)} have no gauge")
        self.eval_unscored.set(unscored)
        for reason, name in UNSCORED_GAUGES.items():
            getattr(self, name).set(reasons.get(reason, 0))
        self.eval_fit_excluded.set(int(excluded))

    def set_domain_pass_rates(self, rates: dict[str, dict[str, Any]]) -> None:
        """Each domain's held-out pass rate and its standard error (history.jsonl's
        `pass_rate_by_domain`)."""
        for domain, rate in rates.items():
            labels = {**self._labels, "domain": domain}
            self._by_domain["eval_domain_pass_rate"].labels(**labels).set(rate["pass_rate"])
            stderr = self._by_domain["eval_domain_pass_rate_stderr"]
            stderr.labels(**labels).set(rate["pass_rate_se"])

    def set_mismatch(self, by_lag: dict[int, dict[str, float]]) -> None:
        """The last step's mismatch figures per policy lag; a lag it did not train on loses its
        series (else a lag seen once would show its old figures for ever)."""
        lags = {str(lag) for lag in by_lag}
        for name, key in TRAINER_LAG_FIELDS.items():
            gauge = self._by_lag[name]
            for gone in self._lags - lags:
                gauge.remove(*self._labels.values(), gone)
            for lag, figures in by_lag.items():
                gauge.labels(**self._labels, lag=str(lag)).set(figures[key])
        self._lags = lags


class RunMetrics:
    """Run-level gauges for any number of runs, each keyed by (namespace, name): the local runner
    serves its one run, the operator every run it manages (a run's series go when the run goes)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._gauges = {
            name: Gauge(PREFIX + name, doc, LABELS, registry=self.registry)
            for name, doc in RUN_GAUGES.items()
        }
        self.track_record = TrackRecordMetrics(self.registry)

    def set_prediction(self, namespace: str, run: str, result: dict[str, Any]) -> None:
        for key, name in {**FIT_GAUGES, **OUTLOOK_GAUGES}.items():
            if result.get(key) is not None:
                self._gauges[name].labels(namespace, run).set(float(result[key]))

    def set_targets(
        self, namespace: str, run: str, pass_rate: float | None, stop_below: float | None
    ) -> None:
        """The run's budget.targetPassRate and budget.stopWhen.predictedABelow (None: it has
        none, and the gauge goes)."""
        for name, value in (("target_pass_rate", pass_rate), ("stop_asymptote_below", stop_below)):
            if value is None:
                self._remove(name, namespace, run)
            else:
                self._gauges[name].labels(namespace, run).set(value)

    def set_sweep_stopped(self, namespace: str, run: str, stopped: bool | None) -> None:
        """Whether the run's sweep stopped it (None: the run belongs to no sweep)."""
        if stopped is None:
            self._remove("sweep_variant_stopped", namespace, run)
        else:
            self._gauges["sweep_variant_stopped"].labels(namespace, run).set(float(stopped))

    def set_restarts(self, namespace: str, run: str, restarts: int) -> None:
        self._gauges["gang_restarts"].labels(namespace, run).set(restarts)

    def forget(self, namespace: str, run: str) -> None:
        for name in self._gauges:
            self._remove(name, namespace, run)
        self.track_record.forget(namespace, run)

    def _remove(self, name: str, namespace: str, run: str) -> None:
        try:
            self._gauges[name].remove(namespace, run)
        except KeyError:
            pass  # never set

    def serve(self, port: int, addr: str) -> None:
        start_http_server(port, addr=addr, registry=self.registry)


class TrackRecordMetrics:
    """TRACK_RECORD_GAUGES: the scored predictions of every finished run one watcher manages (the
    operator: each run's status.trackRecord), pooled by fraction seen (`scalerl.fit.track`).
    Handlers of different runs call it from different threads: one lock guards the pool."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauges = {
            name: Gauge(PREFIX + name, doc, TRACK_RECORD_LABELS, registry=registry)
            for name, doc in TRACK_RECORD_GAUGES.items()
        }
        self._runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def set_run(self, namespace: str, run: str, scored: list[dict[str, Any]] | None) -> None:
        """The run's scored predictions (None: not scored, or no longer: it leaves the pool)."""
        with self._lock:
            if scored is None:
                if self._runs.pop((namespace, run), None) is None:
                    return
            elif self._runs.get((namespace, run)) == scored:
                return
            else:
                self._runs[(namespace, run)] = scored
            self._export()

    def forget(self, namespace: str, run: str) -> None:
        self.set_run(namespace, run, None)

    def _export(self) -> None:
        from scalerl.fit.track import summarise  # late: only a watcher with finished runs

        for bucket in summarise(self._runs.values()):
            seen = f"{bucket['seen']:g}"
            for name, key in TRACK_RECORD_FIELDS.items():
                value = bucket[key]
                if value is None:
                    try:
                        self._gauges[name].remove(seen)
                    except KeyError:
                        pass  # never set
                else:
                    self._gauges[name].labels(seen).set(float(value))
