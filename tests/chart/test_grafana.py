"""The chart's Grafana objects: the "ScaleRL runs" dashboard and the Grafana-managed truncation
alert, as the chart renders them (the real Helm engine) and, where promtool is there, as
Prometheus evaluates their queries.

    objs = render({"alerts": {"truncation": {"threshold": 0.2}}})
    (dashboard,) = dashboards(objs)           # its JSON model, parsed out of the ConfigMap
    (rule,) = alert_rules(objs)               # the Grafana alert rule, out of its ConfigMap
    exprs = queries(objs)                     # every PromQL expression of both
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import CHART, NAMESPACE, of_kind, one, render
from promql import alert_files, alert_rules, dashboards, panels, queries
from promtool import output, promtool_run

from scalerl.fit.law import sigmoid
from scalerl.metrics import (
    COMPUTE_UNIT,
    DOMAIN_LABELS,
    FIT_GAUGES,
    LABELS,
    LAG_LABELS,
    TRACK_RECORD_GAUGES,
    TRACK_RECORD_LABELS,
    TRAINER_DOMAIN_GAUGES,
    TRAINER_GAUGES,
    TRAINER_LAG_GAUGES,
    all_metric_names,
)

Obj = dict[str, Any]

DEFAULTS: Obj = yaml.safe_load((CHART / "values.yaml").read_text())
DASHBOARD_FILES = sorted((CHART / "dashboards").glob("*.json"))

REQUIRED_PANELS = [
    "Pass rate vs compute",
    "Truncation rate",
    "Entropy",
    "Stale prompt groups",
    "Predicted pass rate at the end vs target",
    "Throughput",
    "Weight sync seconds",
    "Weight update size",
    "Step seconds",
    "Gang restarts",
    "Predicted A and C_mid",
    "Held-out pass rate (mean@k)",
    "Train batch pass rate",
    "Sweep variants: predicted A",
    "Sweep variants stopped early",
    "How good were the predictions",
    "Held-out pass rate by domain",
    "Agents: turns and tool calls per rollout",
    "Agents: environment seconds and failed rollouts",
]

# Non-default values for every knob the Grafana objects read.
CUSTOM: Obj = {
    "alerts": {
        "severity": "critical",
        "truncation": {"threshold": 0.2, "window": "10m", "for": "20m"},
        "staleGroups": {"share": 0.4, "window": "1h30m", "for": "1m"},
    },
    "grafana": {
        "dashboards": {"label": "my_dashboards", "labelValue": "yes"},
        "alertRule": {
            "label": "my_alerts",
            "labelValue": "yes",
            "datasourceUid": "prom-main",
            "folder": "RL runs",
            "interval": "30s",
        },
    },
}


def config_maps(objs: list[Obj], label: str, value: str) -> list[Obj]:
    return [
        obj
        for obj in of_kind(objs, "ConfigMap")
        if obj["metadata"].get("labels", {}).get(label) == value
    ]


def the_dashboard(values: Obj | None = None) -> Obj:
    (dashboard,) = dashboards(render(values))
    return dashboard


def by_title(dashboard: Obj) -> dict[str, Obj]:
    return {panel["title"]: panel for panel in panels(dashboard)}


def exprs(panel: Obj) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def squash(expr: str) -> str:
    """An expression without whitespace: PromQL ignores it, and templates lay it out freely."""
    return re.sub(r"\s+", "", expr)


def the_rule(values: Obj | None = None) -> Obj:
    (rule,) = alert_rules(render(values))
    return rule


def data(rule: Obj, ref: str) -> Obj:
    (query,) = [query for query in rule["data"] if query["refId"] == ref]
    return query


def prometheus_rule(alert: str, values: Obj | None = None) -> Obj:
    groups = one(render(values), "PrometheusRule")["spec"]["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == alert]
    return rule


def prometheus_ratio(alert: str, values: Obj | None = None) -> tuple[str, float, str]:
    """A PrometheusRule alert on a ratio over a threshold: (ratio, threshold, hold)."""
    rule = prometheus_rule(alert, values)
    ratio, threshold = rule["expr"].rsplit(">", 1)
    return ratio.strip(), float(threshold), rule["for"]


def prometheus_truncation(values: Obj | None = None) -> tuple[str, float, str]:
    """The PrometheusRule's ScaleRLTruncationRateHigh: (ratio, threshold, hold)."""
    return prometheus_ratio("ScaleRLTruncationRateHigh", values)


def filtered(expr: str) -> str:
    """A rule's expression as a panel runs it: every selector filtered by $namespace and $run."""
    return re.sub(r"(scalerl_\w+)(\[)", r'\1{namespace=~"$namespace",run=~"$run"}\2', expr)


# --- the dashboard ConfigMap ------------------------------------------------------------------


def test_the_dashboard_ships_in_a_configmap_the_grafana_sidecar_loads() -> None:
    (cm,) = config_maps(render(), "grafana_dashboard", "1")
    assert cm["metadata"]["namespace"] == NAMESPACE
    # The chart's own labels too: `helm` and `kubectl -l` find it with the rest of the release.
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "scalerl"
    (name,) = cm["data"]
    assert name == "scalerl-runs.json"
    (dashboard,) = dashboards([cm])  # the entry is JSON that parses into a dashboard
    assert dashboard["uid"] == "scalerl-runs"
    assert dashboard["title"] == "ScaleRL runs"


def test_one_configmap_per_dashboard_file() -> None:
    objs = render()
    assert len(config_maps(objs, "grafana_dashboard", "1")) == len(DASHBOARD_FILES) >= 1
    # At the default values the dashboard is the file as it is (the file holds the defaults),
    # and Grafana's own ${...} variables arrive untouched.
    shipped = {key: text for cm in of_kind(objs, "ConfigMap") for key, text in cm["data"].items()}
    for path in DASHBOARD_FILES:
        assert json.loads(shipped[path.name]) == json.loads(path.read_text())
        assert "${datasource}" in shipped[path.name]


def test_the_dashboard_label_comes_from_values() -> None:
    objs = render(CUSTOM)
    assert config_maps(objs, "grafana_dashboard", "1") == []
    (cm,) = config_maps(objs, "my_dashboards", "yes")
    assert dashboards([cm])[0]["uid"] == "scalerl-runs"


def test_dashboards_can_be_left_out() -> None:
    objs = render({"grafana": {"dashboards": {"enabled": False}}})
    assert dashboards(objs) == []
    assert config_maps(objs, "grafana_dashboard", "1") == []


# --- the dashboard model -----------------------------------------------------------------------


def test_variables_pick_a_prometheus_data_source_namespaces_and_runs() -> None:
    variables = {v["name"]: v for v in the_dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "run"]
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    # Runs are picked within the picked namespaces: two runs of one name in two namespaces are
    # two runs (DESIGN.md, "Metrics").
    expected = {
        "namespace": "label_values(scalerl_policy_version, namespace)",
        "run": 'label_values(scalerl_policy_version{namespace=~"$namespace"}, run)',
    }
    for name, lookup in expected.items():
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["datasource"]["uid"] == "${datasource}"
        query = variable["query"]
        assert (query["query"] if isinstance(query, dict) else query) == lookup
        # Several side by side, or all of them; "All" must be a regex the =~ filter accepts.
        assert variable["multi"] is True and variable["includeAll"] is True
        assert variable["allValue"] == ".*"


def test_every_panel_has_a_title_the_data_source_variable_a_query_and_a_unit() -> None:
    for panel in panels(the_dashboard()):
        title = panel.get("title")
        assert title, panel
        # Every panel and every query follows the data source picked in the dashboard.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", title
            assert target["expr"].strip(), title
        assert panel["fieldConfig"]["defaults"].get("unit"), title
        # A graph says what its axes measure.
        if panel["type"] in ("timeseries", "xychart"):
            assert panel["fieldConfig"]["defaults"]["custom"].get("axisLabel"), title


def test_the_required_panels_exist() -> None:
    titles = [panel["title"] for panel in panels(the_dashboard())]
    assert not set(REQUIRED_PANELS) - set(titles)
    assert len(titles) == len(set(titles))  # a title names one panel


def own_labels(expr: str) -> set[str]:
    """The labels of the series a query reads when they carry one besides the run's: per domain
    (`domain`) or per policy lag (`lag`); else none."""
    names = set(re.findall(r"scalerl_\w+", expr))
    for gauges, labels in (
        (TRAINER_DOMAIN_GAUGES, DOMAIN_LABELS),
        (TRAINER_LAG_GAUGES, LAG_LABELS),
    ):
        if names and names <= {f"scalerl_{name}" for name in gauges}:
            return set(labels)
    return set()


def pooled(expr: str) -> bool:
    """A query of the operator's track record only: its series pool every finished run the
    operator manages (label `seen` alone), so no namespace or run picks them."""
    names = set(re.findall(r"scalerl_\w+", expr))
    return bool(names) and names <= {f"scalerl_{name}" for name in TRACK_RECORD_GAUGES}


def test_every_metric_selector_filters_on_the_namespace_and_run_variables() -> None:
    for panel in panels(the_dashboard()):
        for expr in exprs(panel):
            if pooled(expr):
                continue
            # Every series selector, not just one of them: an unfiltered operand would join
            # every run's series into the picked ones.
            names = re.findall(r"scalerl_\w+", expr)
            assert names, expr
            filtered = re.findall(r'scalerl_\w+\{namespace=~"\$namespace",run=~"\$run"\}', expr)
            assert len(filtered) == len(names), (panel["title"], expr)


def test_queries_aggregate_pods_per_run() -> None:
    for panel in panels(the_dashboard()):
        for expr in exprs(panel):
            # A run (a namespace and a name) has several pods (trainer ranks, generators), and
            # each exports its series.
            groupings = re.findall(r"\b(?:sum|max|min|avg) by \(([^)]*)\)", expr)
            assert groupings, (panel["title"], expr)
            if pooled(expr):  # one operator's series (max: a second scrape of them)
                assert groupings == ["seen"], expr
                continue
            for grouping in groupings:
                labels = {label.strip() for label in grouping.split(",")}
                per_run = [{"namespace", "run"}, {"namespace", "run", "le"}]
                if own_labels(expr):  # one line per domain, or per lag, of the run
                    per_run = [own_labels(expr)]
                assert labels in per_run, expr
            # A counter's rate is summed over the run's pods.
            summed = re.findall(r"sum by \(namespace, run(?:, le)?\) \(rate\(", expr)
            assert expr.count("rate(") == len(summed), (panel["title"], expr)


def labels_read(expr: str) -> set[str]:
    """Every label a PromQL expression names: in selectors, `by (...)` and `on (...)`."""
    found = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for grouping in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", expr):
        found |= {label.strip() for label in grouping.split(",") if label.strip()}
    return found


def test_every_label_a_query_or_legend_reads_is_one_the_code_sets() -> None:
    # scalerl/metrics.py sets LABELS on every series (and histograms have `le`): a query that
    # groups, joins or filters on another label reads nothing, or merges runs.
    assert set(LABELS) == {"namespace", "run"}
    dashboard = the_dashboard()
    for expr in queries(render()):
        track_record = set(TRACK_RECORD_LABELS) if pooled(expr) else set()
        assert labels_read(expr) <= {*LABELS, "le", *track_record, *own_labels(expr)}, expr
    for panel in panels(dashboard):
        for target in panel["targets"]:
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            own = own_labels(target["expr"])
            assert legend <= {*LABELS, *own}, (panel["title"], target["legendFormat"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            assert query.rstrip(")").rsplit(",", 1)[1].strip() in LABELS, query
    for tr in by_title(dashboard)["Pass rate vs compute"]["transformations"]:
        if tr["id"] == "partitionByValues":  # one colour group per run
            assert tr["options"]["fields"] == list(LABELS)


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    found = panels(the_dashboard())
    ids = [panel["id"] for panel in found]
    assert len(ids) == len(set(ids))
    boxes = [(p["title"], p["gridPos"]) for p in found]
    for title, box in boxes:
        assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["w"] <= 24, title
    for i, (a_title, a) in enumerate(boxes):
        for b_title, b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, (a_title, b_title)


def test_pass_rate_vs_compute_plots_each_evaluation_at_the_compute_it_was_measured_at() -> None:
    panel = by_title(the_dashboard())["Pass rate vs compute"]
    assert panel["type"] == "xychart"
    # Options in the xychart model of Grafana 11.1+; an older pluginVersion makes Grafana
    # rewrite them from the pre-11.1 model.
    major, minor = (int(part) for part in panel["pluginVersion"].split(".")[:2])
    assert (major, minor) >= (11, 1)
    targets = {t["refId"]: t["expr"] for t in panel["targets"]}
    # x and y are the pair the trainer exports together at each evaluation: the held-out pass
    # rate and the compute at which it was measured, not the compute spent since.
    read = {ref: set(re.findall(r"scalerl_\w+", expr)) for ref, expr in targets.items()}
    assert read["A"] == {"scalerl_eval_compute_hours"}
    assert read["B"] == {"scalerl_eval_pass_rate"}
    fitted = targets["C"]
    assert read["C"] == {
        "scalerl_eval_compute_hours",
        *(f"scalerl_{gauge}" for gauge in FIT_GAUGES.values()),
    }
    # Every operator between two runs' worth of series (+, -, /, / and ^) joins them by run.
    assert fitted.count("on (namespace, run)") == 5
    assert "scalerl_predicted_asymptote" in targets["D"]
    # x is the compute: the series matcher and the renamed compute column agree.
    (series,) = panel["options"]["series"]
    x_pattern = re.compile(series["x"]["matcher"]["options"])
    organize = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]
    assert x_pattern.match(organize["renameByName"]["Value #A"])
    assert not any(
        x_pattern.match(name) for ref, name in organize["renameByName"].items() if ref != "Value #A"
    )
    # Units: pass rates on y, compute on x, in the unit the run counts (either, by the run).
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    (compute,) = [
        o
        for o in panel["fieldConfig"]["overrides"]
        if o["matcher"]["options"] == series["x"]["matcher"]["options"]
    ]
    properties = {p["id"]: p["value"] for p in compute["properties"]}
    assert properties["unit"] == "short"  # a suffix would name one unit for every run
    assert f"({COMPUTE_UNIT})" in properties["custom.axisLabel"]
    assert COMPUTE_UNIT in TRAINER_GAUGES["eval_compute_hours"]


def test_how_good_the_predictions_were_reads_every_track_record_gauge_by_fraction_seen() -> None:
    panel = by_title(the_dashboard())["How good were the predictions"]
    assert panel["type"] == "table"
    read = {t["refId"]: re.findall(r"scalerl_(\w+)", t["expr"]) for t in panel["targets"]}
    assert sorted(name for names in read.values() for name in names) == sorted(TRACK_RECORD_GAUGES)
    assert all(t["instant"] and t["format"] == "table" for t in panel["targets"])
    # One row per fraction seen: the queries' values, merged on `seen`, named for what they are.
    organize = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]
    columns = {f"Value #{ref}": names[0] for ref, names in read.items()}
    renamed = {organize["renameByName"][value]: gauge for value, gauge in columns.items()}
    assert renamed == {
        "coverage": "track_record_coverage",
        "median error": "track_record_median_error",
        "median width": "track_record_median_width",
        "runs": "track_record_runs",
        "void": "track_record_void",
        "censored": "track_record_censored",
    }
    units = {
        o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}.get("unit")
        for o in panel["fieldConfig"]["overrides"]
    }
    assert units["coverage"] == "percentunit"  # a share, as the gauge's help says
    assert panel["fieldConfig"]["defaults"]["unit"] == "none"  # errors and widths: pass rates


# Panel -> (alert, its values under `alerts`, the name of its threshold there).
ALERT_PANELS = {
    "Truncation rate": ("ScaleRLTruncationRateHigh", "truncation", "threshold"),
    "Stale prompt groups": ("ScaleRLStaleGroupsHigh", "staleGroups", "share"),
}


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["defaults", "custom"])
@pytest.mark.parametrize("title", list(ALERT_PANELS))
def test_an_alert_panel_shows_the_alert_ratio_with_its_threshold_line(
    title: str, values: Obj | None
) -> None:
    alert, key, threshold_key = ALERT_PANELS[title]
    chosen = {**DEFAULTS["alerts"][key], **((values or {}).get("alerts", {}).get(key, {}))}
    panel = by_title(the_dashboard(values))[title]
    ratio, threshold, _ = prometheus_ratio(alert, values)
    # The PrometheusRule's ratio over the release's window, per run (namespace and name) and
    # filtered by $namespace and $run.
    assert squash(panel["targets"][0]["expr"]) == squash(filtered(ratio))
    assert f"[{chosen['window']}]" in panel["targets"][0]["expr"]
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] == "percentunit"
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    # The red line sits at the release's threshold, the alert's.
    steps = [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]
    assert steps == [threshold] == [chosen[threshold_key]]


def test_the_target_panel_compares_what_the_alert_compares() -> None:
    panel = by_title(the_dashboard())["Predicted pass rate at the end vs target"]
    rule = prometheus_rule("ScaleRLPredictedBelowTarget")
    compared = set(re.findall(r"scalerl_\w+", rule["expr"]))
    assert compared == {"scalerl_predicted_at_budget", "scalerl_target_pass_rate"}
    drawn = [set(re.findall(r"scalerl_\w+", expr)) for expr in exprs(panel)]
    assert drawn[:2] == [{"scalerl_predicted_at_budget"}, {"scalerl_target_pass_rate"}]
    assert "spec.budget.targetPassRate" in panel["description"]
    assert "predictedABelow" not in json.dumps(panel)


def test_units_name_what_each_panel_measures() -> None:
    panels_ = by_title(the_dashboard())
    unit = {title: panel["fieldConfig"]["defaults"]["unit"] for title, panel in panels_.items()}
    assert unit["Entropy"] == "suffix:nats"
    assert unit["Weight sync seconds"] == unit["Step seconds"] == "s"
    assert unit["Weight update size"] == "bytes"  # the whole model, or the LoRA adapter alone
    assert unit["Held-out pass rate (mean@k)"] == unit["Train batch pass rate"] == "percentunit"
    assert "tok/s" in unit["Throughput"]
    # Samples/s (a sequence counter) on its own axis, tokens/s from both token counters.
    throughput = panels_["Throughput"]
    assert {"scalerl_generated_tokens_total", "scalerl_trained_tokens_total"} <= {
        name for expr in exprs(throughput) for name in re.findall(r"scalerl_\w+", expr)
    }
    (samples,) = [
        o for o in throughput["fieldConfig"]["overrides"] if o["matcher"]["options"] == "C"
    ]
    assert "scalerl_generated_sequences_total" in next(
        t["expr"] for t in throughput["targets"] if t["refId"] == "C"
    )
    assert {p["id"]: p["value"] for p in samples["properties"]}["unit"].endswith("samples/s")
    # The stale share, with the mean lag of what is trained on its own axis.
    stale = panels_["Stale prompt groups"]
    assert "scalerl_stale_groups_total" in exprs(stale)[0]
    (lag,) = [o for o in stale["fieldConfig"]["overrides"] if o["matcher"]["options"] == "B"]
    assert "scalerl_policy_lag_steps" in exprs(stale)[1]
    assert {p["id"]: p["value"] for p in lag["properties"]}["unit"] == "suffix:versions"


def test_the_agent_panels_read_per_rollout_what_the_generators_count() -> None:
    panels_ = by_title(the_dashboard())
    turns = exprs(panels_["Agents: turns and tool calls per rollout"])
    environment = exprs(panels_["Agents: environment seconds and failed rollouts"])
    per_rollout = "scalerl_generated_sequences_total"
    assert "scalerl_agent_turns_total" in turns[0] and per_rollout in turns[0]
    assert "scalerl_tool_calls_total" in turns[1] and per_rollout in turns[1]
    assert turns[2].index("scalerl_tool_errors_total") < turns[2].index("scalerl_tool_calls_total")
    assert "scalerl_environment_seconds_total" in environment[0]
    assert "scalerl_environment_failures_total" in environment[1]


# --- the Grafana alert rule ------------------------------------------------------------------


def test_the_alert_rule_ships_in_a_configmap_the_grafana_sidecar_loads() -> None:
    objs = render()
    (cm,) = config_maps(objs, "grafana_alert", "1")
    assert cm["metadata"]["namespace"] == NAMESPACE
    (doc,) = alert_files([cm])
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert (group["orgId"], group["folder"], group["interval"]) == (1, "ScaleRL", "1m")


def test_the_alert_rule_is_a_complete_grafana_rule() -> None:
    rule = the_rule()
    for key in ("uid", "title", "condition", "data", "for", "labels", "annotations"):
        assert rule.get(key), key
    assert rule["title"] == "ScaleRLTruncationRateHigh"
    assert (rule["noDataState"], rule["execErrState"]) == ("OK", "Error")
    assert rule["labels"]["severity"] == DEFAULTS["alerts"]["severity"]
    # A: the Prometheus query, B: reduce A to one number per series, C: B over the threshold;
    # the condition is C.
    query, reduce, threshold = (data(rule, ref) for ref in "ABC")
    assert query["datasourceUid"] == "prometheus"
    assert query["model"]["datasource"] == {"type": "prometheus", "uid": "prometheus"}
    assert query["model"]["instant"] is True
    for expression, kind, source in ((reduce, "reduce", "A"), (threshold, "threshold", "B")):
        assert expression["datasourceUid"] == "__expr__"
        assert expression["model"]["type"] == kind
        assert expression["model"]["expression"] == source
    assert rule["condition"] == "C"
    (condition,) = threshold["model"]["conditions"]
    assert condition["evaluator"]["type"] == "gt"


def test_the_alert_annotations_keep_grafana_templates_for_grafana() -> None:
    annotations = the_rule()["annotations"]
    # Helm left Grafana's templates alone: they expand when the alert fires.
    assert "{{ $labels.namespace }}/{{ $labels.run }}" in annotations["summary"]
    assert "{{ $labels.namespace }}/{{ $labels.run }}" in annotations["description"]
    assert "{{ humanizePercentage $values.B.Value }}" in annotations["description"]
    assert "threshold 0.1" in annotations["description"]


@pytest.mark.parametrize("values", [None, CUSTOM], ids=["defaults", "custom"])
def test_the_alert_rule_mirrors_the_prometheus_rule(values: Obj | None) -> None:
    truncation = {
        **DEFAULTS["alerts"]["truncation"],
        **((values or {}).get("alerts", {}).get("truncation", {})),
    }
    rule = the_rule(values)
    ratio, threshold, hold = prometheus_truncation(values)
    # The same ratio (same aggregation, same window) ...
    expr = data(rule, "A")["model"]["expr"]
    assert squash(expr) == squash(ratio)
    assert f"[{truncation['window']}]" in expr
    # ... over the same threshold, held for as long.
    (condition,) = data(rule, "C")["model"]["conditions"]
    assert condition["evaluator"]["params"] == [threshold] == [truncation["threshold"]]
    assert rule["for"] == hold == truncation["for"]


def test_the_alert_rule_follows_its_grafana_values() -> None:
    objs = render(CUSTOM)
    assert config_maps(objs, "grafana_alert", "1") == []
    (cm,) = config_maps(objs, "my_alerts", "yes")
    (doc,) = alert_files([cm])
    (group,) = doc["groups"]
    assert (group["folder"], group["interval"]) == ("RL runs", "30s")
    (rule,) = group["rules"]
    query = data(rule, "A")
    assert query["datasourceUid"] == query["model"]["datasource"]["uid"] == "prom-main"
    assert rule["labels"]["severity"] == "critical"
    assert "threshold 0.2" in rule["annotations"]["description"]


def test_the_alert_rule_can_be_left_out() -> None:
    objs = render({"grafana": {"alertRule": {"enabled": False}}})
    assert alert_files(objs) == []
    assert config_maps(objs, "grafana_alert", "1") == []


# --- the queries -----------------------------------------------------------------------------


def test_queries_lists_every_dashboard_and_alert_expression() -> None:
    objs = render()
    dashboard = the_dashboard()
    targets = [target["expr"] for panel in panels(dashboard) for target in panel["targets"]]
    found = queries(objs)
    # The namespace and run variables' series, the panels' targets and the alert rule's query.
    variables = ["scalerl_policy_version", 'scalerl_policy_version{namespace=~"$namespace"}']
    assert found == [*variables, *targets, data(the_rule(), "A")["model"]["expr"]]
    assert queries(render({"grafana": {"dashboards": {"enabled": False}}})) == found[-1:]
    off = {"grafana": {"dashboards": {"enabled": False}, "alertRule": {"enabled": False}}}
    assert queries(render(off)) == []


def test_every_metric_a_query_reads_is_exported() -> None:
    # scalerl/metrics.py is the one list of exported names; a typo here is an empty panel.
    read = {name for expr in queries(render()) for name in re.findall(r"scalerl_\w+", expr)}
    assert read <= all_metric_names(), read - all_metric_names()


def runnable(expr: str, run: str = ".*", namespace: str = ".*") -> str:
    """A dashboard query as Prometheus runs it once Grafana has put the picked namespaces and
    runs in."""
    return expr.replace("$namespace", namespace).replace("$run", run)


def test_prometheus_parses_every_query(promtool: Path, tmp_path: Path) -> None:
    exprs_ = [runnable(expr) for expr in queries(render())]
    # As recording rules: `promtool check rules` parses and type-checks each expression.
    rules = [
        {"record": f"scalerl_grafana_query_{i}", "expr": expr} for i, expr in enumerate(exprs_)
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    done = promtool_run(promtool, "check", "rules", path)
    assert done.returncode == 0, output(done)
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout, output(done)


# Three runs as Prometheus stores them: the operator's fit gauges (one series per run, labelled
# with the run's namespace) and the trainer's compute at its last evaluation, exported by two
# ranks of r1 in team-a. Two of the runs are named r1, in two namespaces.
FITS = {
    ("team-a", "r1"): {"A": 0.8, "B": 1.5, "C_mid": 100.0, "R0": 0.1, "compute": 50.0},
    ("team-b", "r1"): {"A": 0.5, "B": 1.0, "C_mid": 10.0, "R0": 0.05, "compute": 30.0},
    ("team-a", "r2"): {"A": 0.6, "B": 0.7, "C_mid": 20.0, "R0": 0.2, "compute": 0.0},
}


def fit_series() -> list[Obj]:
    series: list[Obj] = []
    for (namespace, run), fit in FITS.items():
        run_labels = f'namespace="{namespace}",run="{run}"'
        for key, gauge in FIT_GAUGES.items():
            name = f'scalerl_{gauge}{{job="scalerl-operator",{run_labels}}}'
            series.append({"series": name, "values": f"{fit[key]}x10"})
        for rank in (0, 1) if (namespace, run) == ("team-a", "r1") else (0,):
            name = f'scalerl_eval_compute_hours{{pod="{run}-trainer-{rank}",{run_labels}}}'
            series.append({"series": name, "values": f"{fit['compute']}x10"})
    return series


def test_fitted_curve_query_is_the_scaling_law_at_each_evaluations_compute(
    promtool: Path, tmp_path: Path
) -> None:
    panel = by_title(the_dashboard())["Pass rate vs compute"]
    fitted = next(t["expr"] for t in panel["targets"] if t["refId"] == "C")
    checks = []
    for (namespace, run), fit in FITS.items():
        # scalerl.fit.law's R(C); at C = 0 the query divides by zero and must still give R0.
        # Each run (namespace and name) gets its own fit, the same-named one in the other
        # namespace left out.
        expected = float(sigmoid(fit["compute"], fit["A"], fit["B"], fit["C_mid"], fit["R0"]))
        checks.append(
            {
                "expr": f"abs(({runnable(fitted, run, namespace)}) - {expected!r}) < bool 1e-9",
                "eval_time": "5m",
                "exp_samples": [{"labels": f'{{namespace="{namespace}",run="{run}"}}', "value": 1}],
            }
        )
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": fit_series(), "promql_expr_test": checks}],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = promtool_run(promtool, "test", "rules", path)
    assert done.returncode == 0, output(done)


# --- which pass rate --------------------------------------------------------------------------


def test_train_and_held_out_pass_rates_are_on_panels_that_say_which_is_which() -> None:
    # Two different numbers (DESIGN.md, "Metrics": `pass_rate` is the train batch's,
    # `eval_pass_rate` the held-out mean@k): no panel draws both as if comparable.
    found = by_title(the_dashboard())
    reads = {
        title: {name for expr in exprs(panel) for name in re.findall(r"scalerl_\w+", expr)}
        for title, panel in found.items()
    }
    for title, names in reads.items():
        assert not {"scalerl_pass_rate", "scalerl_eval_pass_rate"} <= names, title
    (train,) = [title for title, names in reads.items() if "scalerl_pass_rate" in names]
    assert train == "Train batch pass rate"
    held_out = [title for title, names in reads.items() if "scalerl_eval_pass_rate" in names]
    assert sorted(held_out) == ["Held-out pass rate (mean@k)", "Pass rate vs compute"]
    legends = {
        title: [t.get("legendFormat", "") for t in found[title]["targets"]]
        for title in (train, "Held-out pass rate (mean@k)")
    }
    assert legends == {
        "Train batch pass rate": ["{{namespace}}/{{run}} train batch"],
        "Held-out pass rate (mean@k)": ["{{namespace}}/{{run}} held-out mean@k"],
    }
    assert "reward > 0 and not truncated" in found[train]["description"]
    assert "mean@k" in found["Held-out pass rate (mean@k)"]["description"]


def test_the_domain_panel_draws_one_line_per_domain_of_each_run() -> None:
    panel = by_title(the_dashboard())["Held-out pass rate by domain"]
    (target,) = panel["targets"]
    assert target["expr"] == (
        "max by (namespace, run, domain) "
        '(scalerl_eval_domain_pass_rate{namespace=~"$namespace",run=~"$run"})'
    )
    assert "{{domain}}" in target["legendFormat"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
