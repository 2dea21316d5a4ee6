"""The chart's PrometheusRule, run by Prometheus's own rule engine (promtool).

Every example feeds series as a run's pods export them, one sample a minute (promtool's notation:
`0+100x60` is 0, 100, 200, ... for an hour; `1x50` is 1 for 50 minutes; `_x30` is 30 minutes
without a sample), and says which alerts fire at a given time:

    # One skipped step at 10m: at 12m the alert fires for run local/r1, with the chart's
    # severity.
    expect(
        promtool,
        tmp_path,
        {'scalerl_skipped_steps_total{namespace="local",run="r1"}': "0x10 1x50"},
        check("ScaleRLSkippedSteps", "12m", [labels("r1")]),
    )

promtool compares an alert's labels and annotations exactly, so the behaviour examples run on the
rules without their annotations; `test_annotations_name_the_run` checks the annotations as
Prometheus expands them.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import NAMESPACE, of_kind, one, render
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from promtool import output, promtool_run

from scalerl.metrics import (
    LABELS,
    TRAINER_LAG_GAUGES,
    GeneratorMetrics,
    RunMetrics,
    all_metric_names,
)

Labels = dict[str, str]
Series = dict[str, str]  # series selector -> promtool values notation
Groups = dict[str, Any]  # a Prometheus rules file: {"groups": [...]}

ALERTS = [
    "ScaleRLTruncationRateHigh",
    "ScaleRLNoTrainingProgress",
    "ScaleRLNoLearningSignal",
    "ScaleRLSkippedSteps",
    "ScaleRLWeightSyncFailing",
    "ScaleRLWeightSyncSlow",
    "ScaleRLStaleGroupsHigh",
    "ScaleRLTrainInferenceMismatch",
    "ScaleRLPredictedBelowTarget",
    "ScaleRLPredictionFalling",
    "ScaleRLGangRestarted",
    "ScaleRLGeneratorsBelowDesired",
    "ScaleRLSweepVariantStopped",
]
TEAM = "team-a"  # the namespace of the run's pods in the cluster examples
LOCAL_NAMESPACE = "local"  # a local run's (ScaleRLRun.namespace)


# --- the rules ------------------------------------------------------------------------------


def rule_groups(values: dict[str, Any] | None = None) -> Groups:
    """The PrometheusRule's spec: it is a Prometheus rules file as it stands."""
    if values is None:
        return copy.deepcopy(_default_rule_groups())
    return one(render(values), "PrometheusRule")["spec"]


@functools.cache
def _default_rule_groups() -> Groups:
    # Rendering the chart takes tens of milliseconds, and most examples use the defaults.
    return one(render(), "PrometheusRule")["spec"]


def rules_by_alert(groups: Groups) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups["groups"] for rule in group["rules"]}


def without_annotations(groups: Groups) -> Groups:
    """The rules with no annotations, for examples that assert on labels only."""
    groups = copy.deepcopy(groups)
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return groups


# --- promtool -------------------------------------------------------------------------------


def write_rules(workdir: Path, groups: Groups) -> Path:
    path = workdir / "rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def labels(run: str, namespace: str = LOCAL_NAMESPACE, severity: str = "warning") -> Labels:
    """The labels an alert of one run carries: the run's own and the chart's severity."""
    return {"namespace": namespace, "run": run, "severity": severity}


def check(
    alert: str, at: str, fires: list[Labels], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """An `alert_rule_test`: at `at`, `alert` fires once per label set in `fires` (none: it is
    quiet or only pending), with `annotations` as Prometheus expands them."""
    expected: list[dict[str, Any]] = [{"exp_labels": found} for found in fires]
    if annotations is not None:
        for entry in expected:
            entry["exp_annotations"] = annotations
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


def unit_test(
    series: Series, *checks: dict[str, Any], values: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A promtool test case: input series one sample a minute, alert checks and value checks
    (`promql_expr_test`)."""
    return {
        "interval": "1m",
        "input_series": [{"series": name, "values": notation} for name, notation in series.items()],
        "alert_rule_test": list(checks),
        "promql_expr_test": values or [],
    }


def run_unit_tests(
    promtool: Path, workdir: Path, groups: Groups, tests: list[dict[str, Any]]
) -> None:
    write_rules(workdir, groups)
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    path = workdir / "tests.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = promtool_run(promtool, "test", "rules", path)
    assert done.returncode == 0, output(done)


def expect(promtool: Path, workdir: Path, series: Series, *checks: dict[str, Any]) -> None:
    """Run `checks` on `series` against the default rules, annotations aside."""
    groups = without_annotations(rule_groups())
    run_unit_tests(promtool, workdir, groups, [unit_test(series, *checks)])


def selector(metric: str, **label_values: str) -> str:
    inner = ",".join(f'{name}="{value}"' for name, value in sorted(label_values.items()))
    return f"{metric}{{{inner}}}"


def generator(
    run: str, generated: str, truncated: str, namespace: str = LOCAL_NAMESPACE, **pod: str
) -> Series:
    found = {"namespace": namespace, "run": run, **pod}
    return {
        selector("scalerl_generated_sequences_total", **found): generated,
        selector("scalerl_truncated_sequences_total", **found): truncated,
    }


# The bounds of scalerl_weight_sync_seconds that matter here, as prometheus-client names them.
SYNC_BUCKETS = {"10.0": 10.0, "30.0": 30.0, "60.0": 60.0, "120.0": 120.0, "+Inf": math.inf}


def weight_syncs(seconds: list[float], **label_values: str) -> Series:
    """Cumulative buckets of weight syncs that take `seconds`, every minute for an hour."""
    return {
        selector("scalerl_weight_sync_seconds_bucket", le=le, **label_values): (
            f"0+{sum(took <= bound for took in seconds)}x60"
        )
        for le, bound in SYNC_BUCKETS.items()
    }


# --- the rule file as Prometheus reads it --------------------------------------------------


def test_promtool_accepts_the_rules(promtool: Path, tmp_path: Path) -> None:
    done = promtool_run(promtool, "check", "rules", write_rules(tmp_path, rule_groups()))
    assert done.returncode == 0, output(done)
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout, output(done)


def test_every_alert_exists_once_in_one_group() -> None:
    groups = rule_groups()["groups"]
    assert [group["name"] for group in groups] == ["scalerl.runs"]
    names = [rule["alert"] for rule in groups[0]["rules"]]
    assert sorted(names) == sorted(ALERTS)


def test_the_rule_is_a_monitoring_object_of_the_release() -> None:
    rule = one(render(), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "scalerl"
    assert rule["metadata"]["namespace"] == NAMESPACE
    # kube-prometheus-stack picks up rules by this label.
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_rule_can_be_left_out() -> None:
    objs = render({"monitoring": {"prometheusRule": {"enabled": False}}})
    assert of_kind(objs, "PrometheusRule") == []


def test_every_metric_a_rule_reads_is_exported() -> None:
    for alert, rule in rules_by_alert(rule_groups()).items():
        used = set(re.findall(r"\bscalerl_\w+", rule["expr"]))
        assert used, alert
        assert used <= all_metric_names(), f"{alert} reads {used - all_metric_names()}"


def test_every_rule_aggregates_per_run_and_has_the_severity() -> None:
    values = {"alerts": {"severity": "page", "sweepStopped": {"severity": "note"}}}
    for alert, rule in rules_by_alert(rule_groups(values)).items():
        assert "by (namespace, run" in rule["expr"], alert
        # A sweep's stop is its decision, not a fault: news, at its own severity.
        own = "note" if alert == "ScaleRLSweepVariantStopped" else "page"
        assert rule["labels"] == {"severity": own}, alert


def test_every_label_a_rule_reads_is_one_the_code_sets() -> None:
    # scalerl/metrics.py labels every series with LABELS (histograms add `le`); a rule that
    # groups or joins on another label reads nothing, and one that leaves `namespace` out
    # merges two runs of one name (DESIGN.md, "Metrics").
    assert set(LABELS) == {"namespace", "run"}
    for alert, rule in rules_by_alert(rule_groups()).items():
        groupings = re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", rule["expr"])
        assert groupings, alert
        for grouping in groupings:
            named = {label.strip() for label in grouping.split(",")}
            assert named in (set(LABELS), {*LABELS, "le"}), f"{alert}: ({grouping})"
        # No filter, but one on a lag-labelled series (LAG_LABELS) to its lag 0: mismatch alone.
        filters = re.findall(r"(\w+)\{([^}]*)\}", rule["expr"])
        assert all(
            name.removeprefix("scalerl_") in TRAINER_LAG_GAUGES and inner == 'lag="0"'
            for name, inner in filters
        ), alert


def test_every_threshold_window_and_hold_comes_from_values() -> None:
    values = {
        "alerts": {
            "truncation": {"threshold": 0.31, "window": "7m", "for": "11m"},
            "noProgress": {"window": "17m", "for": "3m"},
            "noLearningSignal": {"steps": 13, "window": "19m", "for": "2m"},
            "skippedSteps": {"steps": 4, "window": "23m", "for": "6m"},
            "weightSync": {"failures": 5, "maxSeconds": 97, "window": "29m", "for": "8m"},
            "staleGroups": {"share": 0.33, "window": "21m", "for": "9m"},
            "mismatch": {"kl": 0.02, "window": "27m", "for": "4m"},
            "prediction": {"drop": 0.07, "window": "5h", "for": "12m"},
            "restarts": {"count": 2, "window": "2h", "for": "1m"},
            "generators": {"for": "14m"},
        }
    }
    rules = rules_by_alert(rule_groups(values))
    expected = {
        "ScaleRLTruncationRateHigh": (["[7m]", "> 0.31"], "11m"),
        "ScaleRLNoTrainingProgress": (["[17m]", "offset 17m"], "3m"),
        "ScaleRLNoLearningSignal": (["[19m]", ">= 13"], "2m"),
        "ScaleRLSkippedSteps": (["[23m]", ">= 4"], "6m"),
        "ScaleRLWeightSyncFailing": (["[29m]", ">= 5"], "8m"),
        "ScaleRLWeightSyncSlow": (["[29m]", "> 97"], "8m"),
        "ScaleRLStaleGroupsHigh": (["[21m]", "> 0.33"], "9m"),
        "ScaleRLTrainInferenceMismatch": (["[27m]", "> 0.02"], "4m"),
        "ScaleRLPredictedBelowTarget": ([], "12m"),
        "ScaleRLPredictionFalling": (["[5h]", "> 0.07"], "12m"),
        "ScaleRLGangRestarted": (["[2h]", ">= 2"], "1m"),
        "ScaleRLGeneratorsBelowDesired": ([], "14m"),
    }
    for alert, (parts, hold) in expected.items():
        for part in parts:
            assert part in rules[alert]["expr"], f"{alert}: {part!r} in {rules[alert]['expr']}"
        assert rules[alert]["for"] == hold, alert


# --- ScaleRLTruncationRateHigh ---------------------------------------------------------------

# 100 sequences a minute; 12 (or 8) of them hit the length limit.
TWELVE_PERCENT = generator("r1", "0+100x60", "0+12x60")
TRUNCATING_POD = generator("r1", "0+100x60", "0+12x60", namespace=TEAM, pod="r1-generator-0")
EIGHT_PERCENT = generator("r1", "0+100x60", "0+8x60")


def test_truncation_fires_after_its_hold_at_a_sustained_12_percent(
    promtool: Path, tmp_path: Path
) -> None:
    alert = "ScaleRLTruncationRateHigh"
    expect(
        promtool,
        tmp_path,
        TWELVE_PERCENT,
        # The ratio is over 10 % from the first rate (1m) on: pending, not firing, for 10m.
        check(alert, "9m", []),
        check(alert, "10m", []),
        check(alert, "12m", [labels("r1")]),
        check(alert, "60m", [labels("r1")]),
    )


def test_truncation_never_fires_at_a_sustained_8_percent(promtool: Path, tmp_path: Path) -> None:
    alert = "ScaleRLTruncationRateHigh"
    expect(promtool, tmp_path, EIGHT_PERCENT, *(check(alert, at, []) for at in ("12m", "60m")))


def test_truncation_ratio_is_the_share_of_truncated_sequences(
    promtool: Path, tmp_path: Path
) -> None:
    groups = without_annotations(rule_groups())
    ratio = rules_by_alert(groups)["ScaleRLTruncationRateHigh"]["expr"].rsplit(">", 1)[0]
    # Two rates divided: round() so that promtool's exact float comparison holds.
    value = {
        "expr": f"round({ratio}, 0.001)",
        "eval_time": "30m",
        "exp_samples": [{"labels": "{namespace='local', run='r1'}", "value": 0.12}],
    }
    run_unit_tests(promtool, tmp_path, groups, [unit_test(TWELVE_PERCENT, values=[value])])


def test_truncation_sums_the_generators_of_a_run(promtool: Path, tmp_path: Path) -> None:
    # Two generator pods of r1 truncate 15 % and 9 %: the run as a whole truncates 12 %. r2's
    # one pod truncates 8 %. One alert per run, without the pod label.
    series = {
        **generator("r1", "0+100x60", "0+15x60", namespace=TEAM, pod="r1-generator-0"),
        **generator("r1", "0+100x60", "0+9x60", namespace=TEAM, pod="r1-generator-1"),
        **generator("r2", "0+100x60", "0+8x60", namespace=TEAM, pod="r2-generator-0"),
    }
    expect(
        promtool,
        tmp_path,
        series,
        check("ScaleRLTruncationRateHigh", "30m", [labels("r1", namespace=TEAM)]),
    )


def test_truncation_is_quiet_when_nothing_is_generated(promtool: Path, tmp_path: Path) -> None:
    # A run that generates nothing has no ratio: neither 0 / 0 (r1) nor, should a scrape land
    # between the two counters' increments, x / 0 (r2).
    series = {**generator("r1", "0x60", "0x60"), **generator("r2", "0x60", "0+1x60")}
    expect(promtool, tmp_path, series, check("ScaleRLTruncationRateHigh", "30m", []))


def test_truncation_threshold_hold_and_severity_come_from_values(
    promtool: Path, tmp_path: Path
) -> None:
    values = {"alerts": {"severity": "critical", "truncation": {"threshold": 0.2, "for": "2m"}}}
    groups = without_annotations(rule_groups(values))
    alert = "ScaleRLTruncationRateHigh"
    run_unit_tests(
        promtool,
        tmp_path,
        groups,
        [
            # 12 % is under a 20 % threshold.
            unit_test(TWELVE_PERCENT, check(alert, "30m", [])),
            # 25 % fires after a hold of 2m instead of 10m.
            unit_test(
                generator("r1", "0+100x60", "0+25x60"),
                check(alert, "2m", []),
                check(alert, "4m", [labels("r1", severity="critical")]),
            ),
        ],
    )


# --- every other alert: it fires on its condition and stays quiet without it ---------------

TRAINER = {"namespace": TEAM, "pod": "r1-trainer-0", "run": "r1"}
GENERATOR = {"namespace": TEAM, "pod": "r1-generator-0", "run": "r1"}
# The operator serves the run-level gauges; locally the runner does, in namespace "local".
LOCAL = {"namespace": LOCAL_NAMESPACE, "run": "r1"}
R1 = [labels("r1", namespace=TEAM)]
R1_LOCAL = [labels("r1")]


def trainer(metric: str, notation: str) -> Series:
    return {selector(metric, **TRAINER): notation}


def local(metric: str, notation: str) -> Series:
    return {selector(metric, **LOCAL): notation}


def lag_kl(by_lag: dict[str, str]) -> Series:
    """The trainer's lag-0 and lag-n mismatch KL series."""
    return {selector("scalerl_mismatch_kl", lag=lag, **TRAINER): v for lag, v in by_lag.items()}


EXAMPLES = [
    # ScaleRLNoTrainingProgress (window 15m, for 5m)
    pytest.param(
        "ScaleRLNoTrainingProgress",
        trainer("scalerl_policy_version", "0+1x20 20x40"),
        "45m",
        R1,
        id="no-progress-fires-when-the-version-stands-still",
    ),
    pytest.param(
        "ScaleRLNoTrainingProgress",
        # Up since 11m and never stepped: past its window (26m) and hold (31m), it is stuck.
        trainer("scalerl_policy_version", "_x10 0x50"),
        "40m",
        R1,
        id="no-progress-fires-for-a-trainer-that-never-stepped",
    ),
    pytest.param(
        "ScaleRLNoTrainingProgress",
        trainer("scalerl_policy_version", "0+1x60"),
        "45m",
        [],
        id="no-progress-quiet-while-steps-go-on",
    ),
    pytest.param(
        "ScaleRLNoTrainingProgress",
        # The trainer came up at 31m and is still loading its model at 40m.
        trainer("scalerl_policy_version", "_x30 0x30"),
        "40m",
        [],
        id="no-progress-quiet-while-the-trainer-starts",
    ),
    pytest.param(
        "ScaleRLNoTrainingProgress",
        # The trainer stopped at 20m and its pod went at 30m.
        trainer("scalerl_policy_version", "0+1x20 20x10 _x30"),
        "45m",
        [],
        id="no-progress-quiet-once-the-trainer-is-gone",
    ),
    # ScaleRLNoLearningSignal (10 steps in 15m)
    pytest.param(
        "ScaleRLNoLearningSignal",
        trainer("scalerl_no_signal_steps_total", "0+1x60"),
        "20m",
        R1,
        id="no-signal-fires-at-a-step-a-minute",
    ),
    pytest.param(
        "ScaleRLNoLearningSignal",
        trainer("scalerl_no_signal_steps_total", "0+1x5 5x55"),
        "10m",
        [],
        id="no-signal-quiet-at-5-steps",
    ),
    # ScaleRLSkippedSteps (1 step in 15m)
    pytest.param(
        "ScaleRLSkippedSteps",
        trainer("scalerl_skipped_steps_total", "0x10 1x50"),
        "12m",
        R1,
        id="skipped-steps-fires-on-one-step",
    ),
    pytest.param(
        "ScaleRLSkippedSteps",
        trainer("scalerl_skipped_steps_total", "0x10 1x50"),
        "30m",
        [],
        id="skipped-steps-quiet-once-the-step-left-the-window",
    ),
    pytest.param(
        "ScaleRLSkippedSteps",
        trainer("scalerl_skipped_steps_total", "0x60"),
        "30m",
        [],
        id="skipped-steps-quiet-without-one",
    ),
    # ScaleRLWeightSyncFailing (1 failure in 15m, for 5m)
    pytest.param(
        "ScaleRLWeightSyncFailing",
        {selector("scalerl_weight_sync_failures_total", **GENERATOR): "0x10 1x50"},
        "18m",
        R1,
        id="sync-failing-fires-on-one-failure",
    ),
    pytest.param(
        "ScaleRLWeightSyncFailing",
        {selector("scalerl_weight_sync_failures_total", **GENERATOR): "0x60"},
        "30m",
        [],
        id="sync-failing-quiet-without-one",
    ),
    # ScaleRLWeightSyncSlow (90th percentile over 60 s, for 5m)
    pytest.param(
        "ScaleRLWeightSyncSlow",
        weight_syncs([90], **GENERATOR),
        "20m",
        R1,
        id="sync-slow-fires-at-90s",
    ),
    pytest.param(
        "ScaleRLWeightSyncSlow",
        # 2 in 10 syncs take 90 s: the 90th percentile is over 60 s, the median is not.
        weight_syncs([20] * 8 + [90] * 2, **GENERATOR),
        "20m",
        R1,
        id="sync-slow-fires-when-1-in-5-syncs-takes-90s",
    ),
    pytest.param(
        "ScaleRLWeightSyncSlow",
        weight_syncs([20], **GENERATOR),
        "20m",
        [],
        id="sync-slow-quiet-at-20s",
    ),
    pytest.param(
        "ScaleRLWeightSyncSlow",
        # 1 in 20 syncs takes 90 s: the 90th percentile is under 30 s.
        weight_syncs([20] * 19 + [90], **GENERATOR),
        "20m",
        [],
        id="sync-slow-quiet-when-1-in-20-syncs-takes-90s",
    ),
    pytest.param(
        "ScaleRLWeightSyncSlow",
        # No sync, no quantile (NaN), no alert.
        weight_syncs([], **GENERATOR),
        "20m",
        [],
        id="sync-slow-quiet-without-syncs",
    ),
    # ScaleRLStaleGroupsHigh (a share over 0.25 within 15m, for 5m). Generators that lag up to
    # 20 versions behind a trainer with maxOffPolicySteps 8: of 16 groups a minute, 9 are
    # dropped stale, while the mean lag of what is trained stays at 2.5 (audit 2026-11-27, S7).
    pytest.param(
        "ScaleRLStaleGroupsHigh",
        {
            **trainer("scalerl_received_groups_total", "0+16x60"),
            **trainer("scalerl_stale_groups_total", "0+9x60"),
            **trainer("scalerl_policy_lag_steps", "2.5x60"),
            **trainer("scalerl_max_off_policy_steps", "8x60"),
        },
        "10m",
        R1,
        id="stale-groups-fires-when-generators-lag",
    ),
    pytest.param(
        "ScaleRLStaleGroupsHigh",
        {
            **trainer("scalerl_received_groups_total", "0+16x60"),
            **trainer("scalerl_stale_groups_total", "0+9x60"),
        },
        "4m",
        [],
        id="stale-groups-pending-before-its-hold",
    ),
    pytest.param(
        "ScaleRLStaleGroupsHigh",
        {
            **trainer("scalerl_received_groups_total", "0+16x60"),
            **trainer("scalerl_stale_groups_total", "0+2x60"),
        },
        "30m",
        [],
        id="stale-groups-quiet-at-an-eighth",
    ),
    pytest.param(
        "ScaleRLStaleGroupsHigh",
        # A burst of 40 stale groups at 5m, then none: out of the window by 30m.
        {
            **trainer("scalerl_received_groups_total", "0+16x60"),
            **trainer("scalerl_stale_groups_total", "0x5 40x55"),
        },
        "30m",
        [],
        id="stale-groups-quiet-once-the-burst-left-the-window",
    ),
    pytest.param(
        "ScaleRLStaleGroupsHigh",
        # Nothing received (a trainer waiting for its first rollouts): no share, no alert.
        {
            **trainer("scalerl_received_groups_total", "0x60"),
            **trainer("scalerl_stale_groups_total", "0x60"),
        },
        "30m",
        [],
        id="stale-groups-quiet-while-nothing-arrives",
    ),
    # ScaleRLPredictedBelowTarget: the pass rate predicted at the run's end against
    # spec.budget.targetPassRate.
    pytest.param(
        "ScaleRLPredictedBelowTarget",
        {
            **local("scalerl_predicted_at_budget", "0.55x60"),
            **local("scalerl_target_pass_rate", "0.6x60"),
        },
        "10m",
        R1_LOCAL,
        id="below-target-fires-under-the-target",
    ),
    pytest.param(
        "ScaleRLPredictedBelowTarget",
        {
            # The asymptote clears the target, but the run ends before the curve gets there.
            **local("scalerl_predicted_asymptote", "0.8x60"),
            **local("scalerl_predicted_at_budget", "0.55x60"),
            **local("scalerl_target_pass_rate", "0.6x60"),
        },
        "10m",
        R1_LOCAL,
        id="below-target-fires-when-the-budget-ends-the-run-first",
    ),
    pytest.param(
        "ScaleRLPredictedBelowTarget",
        {
            **local("scalerl_predicted_at_budget", "0.65x60"),
            **local("scalerl_target_pass_rate", "0.6x60"),
        },
        "10m",
        [],
        id="below-target-quiet-over-the-target",
    ),
    pytest.param(
        "ScaleRLPredictedBelowTarget",
        {
            # The stopWhen threshold is no target: A under it is the stop's business.
            **local("scalerl_predicted_asymptote", "0.45x60"),
            **local("scalerl_predicted_at_budget", "0.45x60"),
            **local("scalerl_stop_asymptote_below", "0.5x60"),
        },
        "10m",
        [],
        id="below-target-quiet-without-a-target",
    ),
    # ScaleRLPredictionFalling (a drop over 0.05 within 6h)
    pytest.param(
        "ScaleRLPredictionFalling",
        local("scalerl_predicted_asymptote", "0.62x120 0.55x60"),
        "150m",
        R1_LOCAL,
        id="prediction-falling-fires-on-a-drop-of-0.07",
    ),
    pytest.param(
        "ScaleRLPredictionFalling",
        local("scalerl_predicted_asymptote", "0.62x120 0.6x60"),
        "150m",
        [],
        id="prediction-falling-quiet-on-a-drop-of-0.02",
    ),
    pytest.param(
        "ScaleRLPredictionFalling",
        local("scalerl_predicted_asymptote", "0.62x30 0.55x400"),
        "420m",
        [],
        id="prediction-falling-quiet-once-the-best-fit-left-the-window",
    ),
    # ScaleRLGangRestarted (1 restart within 1h)
    pytest.param(
        "ScaleRLGangRestarted",
        local("scalerl_gang_restarts", "0x30 1x120"),
        "40m",
        R1_LOCAL,
        id="restarted-fires-on-a-restart",
    ),
    pytest.param(
        "ScaleRLGangRestarted",
        local("scalerl_gang_restarts", "0x30 1x120"),
        "100m",
        [],
        id="restarted-quiet-an-hour-later",
    ),
    pytest.param(
        "ScaleRLGangRestarted",
        # The run was deleted and created again under its name: its count starts at 0 again.
        local("scalerl_gang_restarts", "3x30 0x30"),
        "45m",
        [],
        id="restarted-quiet-when-the-run-is-created-again",
    ),
    # ScaleRLGeneratorsBelowDesired (the trainer's group short of the replicas for 15m)
    pytest.param(
        "ScaleRLGeneratorsBelowDesired",
        # Generator 1 lost at 10m, its replacement never joins.
        {
            **trainer("scalerl_generators_desired", "2x60"),
            **trainer("scalerl_generators_ready", "2x10 1x50"),
        },
        "30m",
        R1,
        id="generators-below-fires-when-a-replacement-never-joins",
    ),
    pytest.param(
        "ScaleRLGeneratorsBelowDesired",
        # Lost at 10m, its replacement joined 3 minutes later: within the hold.
        {
            **trainer("scalerl_generators_desired", "2x60"),
            **trainer("scalerl_generators_ready", "2x10 1x3 2x47"),
        },
        "30m",
        [],
        id="generators-below-quiet-when-the-replacement-joins",
    ),
    # ScaleRLTrainInferenceMismatch (lag-0 KL averaged over 15m above 0.001, for 10m)
    pytest.param(
        "ScaleRLTrainInferenceMismatch",
        lag_kl({"0": "0.0001x10 0.004x50", "1": "0.02x60"}),
        "30m",
        R1,
        id="mismatch-fires-when-lag-0-disagrees",
    ),
    pytest.param(
        "ScaleRLTrainInferenceMismatch",
        # Lag 1 reads 0.02: the policy moved a step, which is no mismatch.
        lag_kl({"0": "0.0002x60", "1": "0.02x60"}),
        "30m",
        [],
        id="mismatch-quiet-on-policy-lag-alone",
    ),
    pytest.param(
        "ScaleRLTrainInferenceMismatch",
        # One odd step (0.01 for a minute) in a quiet window: its 15m mean stays under 0.001.
        lag_kl({"0": "0.0002x20 0.01 0.0002x39"}),
        "30m",
        [],
        id="mismatch-quiet-on-one-odd-step",
    ),
    # ScaleRLSweepVariantStopped (at once; its own severity)
    pytest.param(
        "ScaleRLSweepVariantStopped",
        local("scalerl_sweep_variant_stopped", "0x10 1x30"),
        "15m",
        [labels("r1", severity="info")],
        id="sweep-stopped-fires-once-stopped",
    ),
    pytest.param(
        "ScaleRLSweepVariantStopped",
        local("scalerl_sweep_variant_stopped", "0x40"),
        "15m",
        [],
        id="sweep-stopped-quiet-while-in-the-race",
    ),
]


@pytest.mark.parametrize(("alert", "series", "at", "fires"), EXAMPLES)
def test_alert(
    promtool: Path, tmp_path: Path, alert: str, series: Series, at: str, fires: list[Labels]
) -> None:
    expect(promtool, tmp_path, series, check(alert, at, fires))


def test_every_alert_has_an_example_that_fires_and_one_that_does_not() -> None:
    firing = {param.values[0] for param in EXAMPLES if param.values[3]}
    quiet = {param.values[0] for param in EXAMPLES if not param.values[3]}
    others = set(ALERTS) - {"ScaleRLTruncationRateHigh"}  # its own tests above
    assert firing == others
    assert quiet == others


# --- annotations ------------------------------------------------------------------------------


def test_annotations_are_prometheus_templates_that_name_the_run() -> None:
    # Helm must leave Prometheus's templates alone: they expand only when the alert fires. A run
    # is its namespace and its name: two runs of one name in two namespaces are two runs.
    for alert, rule in rules_by_alert(rule_groups()).items():
        for key in ("summary", "description"):
            named = "{{ $labels.namespace }}/{{ $labels.run }}"
            assert named in rule["annotations"][key], f"{alert} {key}"


# What the one on call reads, as Prometheus expands it, for each alert's first firing example.
ANNOTATIONS = {
    "ScaleRLTruncationRateHigh": (
        "Run team-a/r1 truncates too many sequences",
        "12% of the sequences run team-a/r1 generated over the last 5m hit the hard length limit"
        " (threshold 0.1); the policy learns from cut-off answers.",
    ),
    "ScaleRLNoTrainingProgress": (
        "Run team-a/r1 makes no training progress",
        "The trainer of run team-a/r1 has not advanced its policy version for 15m although it"
        " runs; check its logs and whether its generators deliver rollouts.",
    ),
    "ScaleRLNoLearningSignal": (
        "Run team-a/r1 gets no learning signal",
        "Steps of run team-a/r1 over the last 15m that had every prompt group filtered out (all"
        " rewards equal): about 15. Its prompts are all too easy or all too hard for the"
        " policy.",
    ),
    "ScaleRLSkippedSteps": (
        "Run team-a/r1 skips optimizer steps",
        "Optimizer steps of run team-a/r1 skipped for a non-finite loss or gradient over the"
        " last 15m: about 1.",
    ),
    "ScaleRLWeightSyncFailing": (
        "Weight updates of run team-a/r1 fail",
        "Failed weight updates of run team-a/r1 over the last 15m: about 1. Its generators keep"
        " sampling from the policy version they hold.",
    ),
    "ScaleRLWeightSyncSlow": (
        "Weight updates of run team-a/r1 are slow",
        "9 in 10 weight syncs of run team-a/r1 over the last 15m took up to 1m 54s (limit 60s).",
    ),
    "ScaleRLStaleGroupsHigh": (
        "Run team-a/r1 drops many prompt groups as stale",
        "56.25% of the prompt groups the trainer of run team-a/r1 received over the last 15m were"
        " older than its maxOffPolicySteps allows and were dropped (threshold 0.25): its"
        " generators lag behind the trainer, and their work is wasted.",
    ),
    "ScaleRLTrainInferenceMismatch": (
        "Generators and trainer of run team-a/r1 disagree on token probabilities",
        "The KL between the generators' and the trainer's token probabilities of run team-a/r1,"
        " on tokens sampled with the weights the trainer holds, averaged 0.004 over the last"
        " 15m (threshold 0.001): numeric mismatch, not policy lag. Check the dtypes, the FP32 LM"
        " head and the sampling settings; recipe.correction bounds what it does to the loss.",
    ),
    # A local run's namespace is "local".
    "ScaleRLPredictedBelowTarget": (
        "Run local/r1 is predicted to end below its target pass rate",
        "The fit of run local/r1 predicts a held-out pass rate of 0.550 where the run will end"
        " (predictedAtBudget), below its target pass rate (spec.budget.targetPassRate).",
    ),
    "ScaleRLPredictionFalling": (
        "The prediction of run local/r1 is falling",
        "The fitted asymptotic pass rate of run local/r1 fell 0.070 below its best over the last"
        " 6h (limit 0.05).",
    ),
    "ScaleRLGangRestarted": (
        "Run local/r1 restarted from its last checkpoint",
        "Gang restarts of run local/r1 from its last checkpoint over the last 1h: 1.",
    ),
    "ScaleRLGeneratorsBelowDesired": (
        "Run team-a/r1 has fewer generators than it asks for",
        "The weight-sync group of run team-a/r1 has held fewer generators than"
        " spec.generators.replicas for 15m (1 now): a lost generator's replacement has not joined"
        " (see the run's GeneratorReplaced Events and its generator pods).",
    ),
    "ScaleRLSweepVariantStopped": (
        "Run local/r1 was stopped early by its sweep",
        "Its ScaleRLSweep stopped run local/r1, one of its variants: its predicted A interval lies"
        " below the best variant's. Its checkpoints are kept; kubectl get srls shows the leader,"
        " and the run's annotation scalerl.dev/stopped-by-sweep says why.",
    ),
}


def test_annotations_name_the_run(promtool: Path, tmp_path: Path) -> None:
    # One firing example per alert; the truncation alert's on a generator pod of team-a.
    firing: dict[str, tuple[Series, str, list[Labels]]] = {
        "ScaleRLTruncationRateHigh": (TRUNCATING_POD, "30m", R1)
    }
    for param in EXAMPLES:
        alert, series, at, fires = param.values
        if fires:
            firing.setdefault(alert, (series, at, fires))  # type: ignore[arg-type]
    assert firing.keys() == ANNOTATIONS.keys() == set(ALERTS)
    tests: list[dict[str, Any]] = []
    for alert, (series, at, fires) in firing.items():
        summary, description = ANNOTATIONS[alert]
        expanded = {"summary": summary, "description": description}
        tests.append(unit_test(series, check(alert, at, fires, expanded)))
    # All of them in one promtool run: with annotations this time.
    run_unit_tests(promtool, tmp_path, rule_groups(), tests)


# --- two runs of one name in two namespaces ---------------------------------------------------
#
# The series below are what the code exports (a real RunMetrics or GeneratorMetrics), as
# Prometheus stores them once the chart's ServiceMonitor or PodMonitor has scraped them.


def monitor_honors_labels(kind: str) -> bool:
    """Whether the chart's PodMonitor or ServiceMonitor keeps a scraped label over its own."""
    spec = one(render(), kind)["spec"]
    (endpoint,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    return bool(endpoint.get("honorLabels", False))


def scraped(registry: CollectorRegistry, target: Labels, honor_labels: bool) -> dict[str, float]:
    """A /metrics as Prometheus stores it: selector -> value, the target's labels added. Where
    both name a label, the target's wins and the scraped one is kept as `exported_<name>`,
    unless honor_labels (then the scraped one wins), as Prometheus's scrape config says."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            label_values = dict(sample.labels)
            for name, value in target.items():
                if name in label_values and honor_labels:
                    continue
                if name in label_values:
                    label_values[f"exported_{name}"] = label_values[name]
                label_values[name] = value
            found[selector(sample.name, **label_values)] = sample.value
    return found


def operator_series(metrics: RunMetrics) -> Series:
    """The operator's run gauges, scraped by the ServiceMonitor in the operator's namespace,
    constant for an hour."""
    target = {"namespace": NAMESPACE, "job": "scalerl-operator", "pod": "scalerl-operator-0"}
    honor = monitor_honors_labels("ServiceMonitor")
    return {name: f"{value}x60" for name, value in scraped(metrics.registry, target, honor).items()}


def generator_series(namespace: str, run: str, generated: int, truncated: int) -> Series:
    """One generator pod of the run, scraped by the PodMonitor: `generated` sequences a minute,
    `truncated` of them cut, for an hour."""
    metrics = GeneratorMetrics(namespace, run)
    metrics.generated_sequences.inc(generated)
    metrics.truncated_sequences.inc(truncated)
    target = {"namespace": namespace, "pod": f"{run}-generator-0", "job": "scalerl-runs"}
    honor = monitor_honors_labels("PodMonitor")
    found = scraped(metrics.registry, target, honor)
    return {name: f"0+{value:g}x60" for name, value in found.items()}


def each_names_its_namespace(
    alert: str, at: str, expanded: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """An alert check: `alert` fires once for run foo in each namespace of `expanded`, with that
    namespace's (summary, description)."""
    expected = [
        {
            "exp_labels": labels("foo", namespace),
            "exp_annotations": {"summary": summary, "description": description},
        }
        for namespace, (summary, description) in expanded.items()
    ]
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


def below_target(at_budget: dict[str, float]) -> RunMetrics:
    """The operator's gauges for a run named foo in each namespace of `at_budget`: its pass rate
    predicted at its end (A 0.9, well above) and a target pass rate of 0.6."""
    metrics = RunMetrics()
    for namespace, predicted in at_budget.items():
        fit = {"A": 0.9, "B": 1.0, "C_mid": 10.0, "R0": 0.1, "predictedAtBudget": predicted}
        metrics.set_prediction(namespace, "foo", fit)
        metrics.set_targets(namespace, "foo", pass_rate=0.6, stop_below=None)
    return metrics


def test_same_named_runs_in_two_namespaces_alert_apart_on_the_operators_series(
    promtool: Path, tmp_path: Path
) -> None:
    alert = "ScaleRLPredictedBelowTarget"

    def expanded(namespace: str, predicted: float) -> tuple[str, str]:
        return (
            f"Run {namespace}/foo is predicted to end below its target pass rate",
            f"The fit of run {namespace}/foo predicts a held-out pass rate of {predicted:.3f}"
            " where the run will end (predictedAtBudget), below its target pass rate"
            " (spec.budget.targetPassRate).",
        )

    both_below = {"team-a": expanded("team-a", 0.55), "team-b": expanded("team-b", 0.45)}
    run_unit_tests(
        promtool,
        tmp_path,
        rule_groups(),
        [
            # Both below the target: two alerts, each naming its own namespace, not the
            # operator's.
            unit_test(
                operator_series(below_target({"team-a": 0.55, "team-b": 0.45})),
                each_names_its_namespace(alert, "10m", both_below),
            ),
            # foo in team-b above it: team-a's alert alone.
            unit_test(
                operator_series(below_target({"team-a": 0.55, "team-b": 0.65})),
                each_names_its_namespace(alert, "10m", {"team-a": expanded("team-a", 0.55)}),
            ),
        ],
    )


def test_same_named_runs_in_two_namespaces_alert_apart_on_their_pods_series(
    promtool: Path, tmp_path: Path
) -> None:
    alert = "ScaleRLTruncationRateHigh"

    def expanded(namespace: str) -> tuple[str, str]:
        return (
            f"Run {namespace}/foo truncates too many sequences",
            f"12% of the sequences run {namespace}/foo generated over the last 5m hit the hard"
            " length limit (threshold 0.1); the policy learns from cut-off answers.",
        )

    run_unit_tests(
        promtool,
        tmp_path,
        rule_groups(),
        [
            # Both truncate 12 %: two alerts, each naming its own namespace.
            unit_test(
                {
                    **generator_series("team-a", "foo", 100, 12),
                    **generator_series("team-b", "foo", 100, 12),
                },
                each_names_its_namespace(
                    alert, "30m", {ns: expanded(ns) for ns in ("team-a", "team-b")}
                ),
            ),
            # team-a's foo truncates 12 %, team-b's 8 %: merged they would be 10 %, no alert.
            unit_test(
                {
                    **generator_series("team-a", "foo", 100, 12),
                    **generator_series("team-b", "foo", 100, 8),
                },
                each_names_its_namespace(alert, "30m", {"team-a": expanded("team-a")}),
            ),
        ],
    )
