"""Conditions in the shape of Kubernetes' metav1.Condition, keyed by type.

`lastTransitionTime` changes only when a condition's status flips, as API conventions ask, so a
condition that stays true keeps the time it became true.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypedDict


class Condition(TypedDict):
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str  # CamelCase
    message: str
    lastTransitionTime: str


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new list with condition `type_` set; other conditions unchanged, order kept."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value else None
    new: Condition = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now or now_rfc3339(),
    }
    if old is None:
        return [*conditions, dict(new)]
    return [dict(new) if c is old else c for c in conditions]
