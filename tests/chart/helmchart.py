"""The chart as a user installs it: rendered by the real Helm engine (helm-python-sdk).

objs = render({"networkPolicy": {"enabled": False}})
rule = one(objs, "PrometheusRule")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "scalerl"
RELEASE = "scalerl"
NAMESPACE = "scalerl-system"
KUBE_VERSION = "1.30.0"


# The monitors' default `enabled: auto` renders them where the cluster serves
# monitoring.coreos.com/v1; helm-python-sdk renders offline and cannot say so, so a render "with
# the Prometheus Operator" sets them true, as `helm template --api-versions` would.
MONITORS = ("podMonitor", "serviceMonitor", "prometheusRule")


def render_files(
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    prometheus_operator: bool = True,
) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print them (by default for a
    cluster with the Prometheus Operator)."""
    values = values or {}
    if prometheus_operator:
        monitoring = values.get("monitoring", {})
        on = {m: {"enabled": True, **monitoring.get(m, {})} for m in MONITORS}
        values = {**values, "monitoring": {**monitoring, **on}}
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values, name=release, namespace=namespace, is_install=True)


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Every rendered manifest (NOTES.txt aside), parsed."""
    objs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, **kwargs).items()):
        if path.endswith(".txt"):
            continue
        objs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objs


def crds() -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        return [yaml.safe_load(entry["data"]) for entry in chart.crds]


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objs if obj.get("kind") == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
