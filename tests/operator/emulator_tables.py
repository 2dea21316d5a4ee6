"""Server-side printing: `meta.k8s.io/v1` Table responses, as kubectl requests for `get`.

kubectl asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io, …`; the columns are the
object's NAME and the resource type's printer columns: a CRD's `additionalPrinterColumns` (AGE only
when it declares none, as the real server does), a built-in's own columns and AGE.
Dates are shown as ages (`12s`, `5m3s`, `2d`), as the API server does.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from typing import Any

from emulator_catalog import Column, ResourceType
from emulator_query import SelectorError, jsonpath

NAME = Column(
    "Name",
    "string",
    ".metadata.name",
    format="name",
    description="Name must be unique within a namespace.",
)
AGE = Column(
    "Age",
    "date",
    ".metadata.creationTimestamp",
    description="CreationTimestamp is a timestamp of when the object was created.",
)


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def human_age(seconds: float) -> str:
    """A short age in the Kubernetes style: 45s, 3m12s, 17m, 5h20m, 30h, 3d4h, 120d, 2y30d."""
    s = max(int(seconds), 0)
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    if d < 365 * 8 and d % 365:
        return f"{d // 365}y{d % 365}d"
    return f"{d // 365}y"


def _cell(column: Column, obj: Mapping[str, Any], now: datetime.datetime) -> Any:
    try:
        found = jsonpath(obj, column.json_path)
    except SelectorError:
        return None
    if not found or found[0] is None:
        return None
    return _typed(column.type, found[0], now)


def _typed(kind: str, value: Any, now: datetime.datetime) -> Any:
    try:
        if kind == "date":
            return human_age((now - parse_time(str(value))).total_seconds())
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value) if not isinstance(value, int) else value
        if kind == "boolean":
            return bool(value)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _printer_columns(rtype: ResourceType) -> tuple[Column, ...]:
    """After NAME: a CRD's own columns, which replace the default AGE (apiextensions-apiserver's
    serveDefaultColumnsIfEmpty: a CRD that wants an age declares it); a built-in's, then AGE."""
    if rtype.custom:
        return rtype.columns or (AGE,)
    return (*rtype.columns, AGE)


def _definition(column: Column) -> dict[str, Any]:
    return {
        "name": column.name,
        "type": column.type,
        "format": column.format,
        "description": column.description,
        "priority": column.priority,
    }


def _row_object(obj: Mapping[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rtype: ResourceType,
    objs: Iterable[Mapping[str, Any]],
    *,
    resource_version: str,
    now: datetime.datetime,
    include_object: str = "Metadata",
) -> dict[str, Any]:
    columns = (NAME, *_printer_columns(rtype))
    rows = [
        {"cells": [_cell(c, obj, now) for c in columns], "object": _row_object(obj, include_object)}
        for obj in objs
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [_definition(c) for c in columns],
        "rows": rows,
    }
