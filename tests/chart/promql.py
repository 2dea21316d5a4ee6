"""The PromQL the chart's Grafana objects run, read out of rendered manifests.

    objs = render()
    for expr in queries(objs):
        ...  # e.g. run it against a Prometheus that scrapes a live run

The objects are found by content, not by label (the sidecar labels are values): a ConfigMap entry
`*.json` holding a dashboard (it has `panels`), or `*.yaml` holding a Grafana alerting
provisioning file (it has `groups`). Grafana's variables stay in the expressions: `$run` is a
regex of run names and appears only as `run=~"$run"`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

Obj = dict[str, Any]

# Grafana's `label_values(metric, label)` lists a label's values over the series of `metric`: the
# PromQL it stands for is the selector alone.
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*\w+\s*\)\s*$", re.S)


def _entries(objs: list[Obj], suffixes: tuple[str, ...]) -> list[str]:
    return [
        text
        for obj in objs
        if obj.get("kind") == "ConfigMap"
        for key, text in (obj.get("data") or {}).items()
        if key.endswith(suffixes)
    ]


def dashboards(objs: list[Obj]) -> list[Obj]:
    """Every Grafana dashboard (its JSON model) shipped in a ConfigMap."""
    found = [json.loads(text) for text in _entries(objs, (".json",))]
    return [doc for doc in found if isinstance(doc, dict) and "panels" in doc]


def alert_files(objs: list[Obj]) -> list[Obj]:
    """Every Grafana alerting provisioning file shipped in a ConfigMap."""
    found = [yaml.safe_load(text) for text in _entries(objs, (".yaml", ".yml"))]
    return [doc for doc in found if isinstance(doc, dict) and "groups" in doc]


def alert_rules(objs: list[Obj]) -> list[Obj]:
    """Every Grafana-managed alert rule of those files."""
    return [rule for doc in alert_files(objs) for group in doc["groups"] for rule in group["rules"]]


def panels(dashboard: Obj) -> list[Obj]:
    """The dashboard's panels, those inside collapsed rows included; rows themselves are not."""
    found: list[Obj] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panels(panel))
        else:
            found.append(panel)
    return found


def variable_query(variable: Obj) -> str | None:
    """The PromQL behind a query variable (None for other kinds or a label-only lookup)."""
    if variable.get("type") != "query":
        return None
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else str(query or "")
    match = _LABEL_VALUES.match(text)
    if match:
        return match["selector"]
    # label_names(), label_values(label) and the like have no series selector to run.
    return None if text.strip().startswith(("label_", "metrics(", "query_result(")) else text


def queries(objs: list[Obj]) -> list[str]:
    """Every PromQL expression of the rendered dashboards (panel targets, query variables) and
    Grafana alert rules (data source queries; Grafana's own expressions are not PromQL)."""
    found: list[str] = []
    for dashboard in dashboards(objs):
        for variable in dashboard.get("templating", {}).get("list", []):
            expr = variable_query(variable)
            if expr:
                found.append(expr)
        for panel in panels(dashboard):
            found.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
    for rule in alert_rules(objs):
        for query in rule["data"]:
            if query.get("datasourceUid") != "__expr__" and query["model"].get("expr"):
                found.append(query["model"]["expr"])
    return found
