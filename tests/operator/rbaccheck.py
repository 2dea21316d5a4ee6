"""The chart's ClusterRole against the API calls the operator makes.

A permission is (API group, resource[/subresource], verb), as RBAC checks a request. The
operator's own calls are told apart by their User-Agent: kopf's (`kopf/…`) and our client's
(`scalerl-operator/…`); the test's kubectl, the trainer's status sink and the fit Job differ.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import helm_python
import yaml
from emulator_requests import ApiCall

from scalerl.operator import names

CHART = Path(__file__).resolve().parents[2] / "helm" / "scalerl"
OPERATOR_AGENTS = ("kopf/", f"{names.MANAGED_BY}/")
Permission = tuple[str, str, str]  # (group, resource, verb)


@functools.cache
def chart_rules() -> tuple[dict[str, list[str]], ...]:
    """The rules of the ClusterRole the chart installs for the operator (default values)."""
    with helm_python.Chart.load(CHART) as chart:
        text = chart.render({}, name="scalerl", namespace="scalerl-system")
    docs = yaml.safe_load_all(text["scalerl/templates/rbac.yaml"])
    role = next(doc for doc in docs if doc and doc["kind"] == "ClusterRole")
    return tuple(role["rules"])


def granted() -> set[Permission]:
    return {
        (group, resource, verb)
        for rule in chart_rules()
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def by_operator(calls: Iterable[ApiCall]) -> list[ApiCall]:
    return [c for c in calls if c.user_agent.startswith(OPERATOR_AGENTS)]


def needed(calls: Iterable[ApiCall]) -> set[Permission]:
    """What RBAC must grant for the operator's resource requests (discovery needs nothing:
    every authenticated user may read /api and /apis)."""
    return {
        (c.group or "", c.rbac_resource, c.verb)
        for c in by_operator(calls)
        if c.rbac_resource is not None
    }


def denied(calls: Iterable[ApiCall]) -> list[str]:
    """Each operator request the chart's ClusterRole would refuse, as `VERB PATH`. Only where
    our operator ran: the emulator's own tests run kopf with handlers of their own."""
    calls = list(calls)
    if not any(c.user_agent.startswith(f"{names.MANAGED_BY}/") for c in calls):
        return []
    allowed = granted()
    return sorted(
        f"{c.verb} {c.path}"
        for c in by_operator(calls)
        if c.rbac_resource is not None and (c.group or "", c.rbac_resource, c.verb) not in allowed
    )
