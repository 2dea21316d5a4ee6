"""Prometheus metrics: every name the processes export, the chart's rules and dashboards use, in
one place.

Prefix `scalerl_`, labels `namespace` and `run` on every series (two runs of one name in two
namespaces are two series; a local run's namespace is "local"); units in names; counters end in
`_total` (prometheus-client appends it). Each process builds the set it owns on its own registry
and serves `/metrics` on its port.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

# `*_created` series double the series count and nothing of ours reads them.
disable_created_metrics()

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
    "weight_sync_failures": "Weight updates that failed; the previous version stayed loaded.",
}
GENERATOR_GAUGES = {
    "generator_policy_version": "Policy version loaded in this generator.",
}
TRAINER_COUNTERS = {
    "trained_tokens": "Completion tokens trained on (loss tokens).",
    "zero_variance_groups": "Prompt groups dropped because all rewards were equal.",
    "stale_groups": "Prompt groups dropped for being more than k policy versions old.",
    "skipped_steps": "Optimizer steps skipped for a non-finite loss or gradient.",
    "no_signal_steps": "Steps whose every group was filtered out (all right or all wrong).",
}
TRAINER_GAUGES = {
    "entropy": "Mean token entropy (nats) of the last training batch.",
    "pass_rate": (
        "Train pass rate of the last batch (reward > 0 and not truncated), over every sample"
        " received for it."
    ),
    "eval_pass_rate": "Held-out pass rate (mean@k) of the last evaluation.",
    "eval_pass_rate_stderr": (
        "Standard error of eval_pass_rate, from the per-prompt means of that evaluation."
    ),
    "eval_compute_hours": (
        "Compute (GPU-hours; process-hours locally) at which the last evaluation"
        " (eval_pass_rate) was measured."
    ),
    "policy_version": "Policy version of the trainer.",
    "policy_lag_steps": (
        "Mean policy versions between generation and training over the tokens of the last"
        " trained batch (kept samples only)."
    ),
    "compute_hours": "Compute spent (GPU-hours; process-hours locally).",
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
HISTOGRAMS = {
    "weight_sync_seconds": "Seconds to send (trainer) or receive and load (generator) weights.",
    "step_seconds": "Seconds of one optimizer step (forward, backward, update).",
}
# Per run, from whoever watches the run as a whole: the local runner, or the operator (one
# series per run it manages).
RUN_GAUGES = {
    "predicted_asymptote": "Fitted asymptotic pass rate A of the scaling curve.",
    "predicted_cmid": "Fitted compute midpoint C_mid (GPU-hours; process-hours locally).",
    "predicted_slope": "Fitted scaling exponent B of the scaling curve.",
    "predicted_r0": "Pass rate at zero compute the fit anchors the curve at (R0).",
    "target_asymptote": "The run's target: spec.budget.stopWhen.predictedABelow (absent if none).",
    "gang_restarts": "Gang restarts from the last checkpoint so far.",
    "sweep_variant_stopped": "1 once the run's ScaleRLSweep stopped it (a variant whose A "
    "interval lies below the best one's), else 0; absent for a run of no sweep.",
}
# Fit result key -> the gauge it sets.
FIT_GAUGES = {
    "A": "predicted_asymptote",
    "C_mid": "predicted_cmid",
    "B": "predicted_slope",
    "R0": "predicted_r0",
}


def all_metric_names() -> set[str]:
    """Every series name as Prometheus stores it (counters with `_total`, histogram parts)."""
    names = {f"{PREFIX}{n}_total" for n in {**GENERATOR_COUNTERS, **TRAINER_COUNTERS}}
    names |= {f"{PREFIX}{n}" for n in {**GENERATOR_GAUGES, **TRAINER_GAUGES, **RUN_GAUGES}}
    for n in HISTOGRAMS:
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
        sync = {"weight_sync_seconds": HISTOGRAMS["weight_sync_seconds"]}
        super().__init__(namespace, run, GENERATOR_COUNTERS, GENERATOR_GAUGES, sync, alongside)


class TrainerMetrics(_Metrics):
    def __init__(self, namespace: str, run: str) -> None:
        super().__init__(namespace, run, TRAINER_COUNTERS, TRAINER_GAUGES, HISTOGRAMS)


class RunMetrics:
    """Run-level gauges for any number of runs, each keyed by (namespace, name): the local runner
    serves its one run, the operator every run it manages (a run's series go when the run goes)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._gauges = {
            name: Gauge(PREFIX + name, doc, LABELS, registry=self.registry)
            for name, doc in RUN_GAUGES.items()
        }

    def set_prediction(self, namespace: str, run: str, result: dict[str, Any]) -> None:
        for key, name in FIT_GAUGES.items():
            if result.get(key) is not None:
                self._gauges[name].labels(namespace, run).set(float(result[key]))

    def set_target(self, namespace: str, run: str, target: float | None) -> None:
        if target is None:
            self._remove("target_asymptote", namespace, run)
        else:
            self._gauges["target_asymptote"].labels(namespace, run).set(target)

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

    def _remove(self, name: str, namespace: str, run: str) -> None:
        try:
            self._gauges[name].remove(namespace, run)
        except KeyError:
            pass  # never set

    def serve(self, port: int, addr: str) -> None:
        start_http_server(port, addr=addr, registry=self.registry)
