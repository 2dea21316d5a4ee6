"""Pydantic JSON schema -> Kubernetes structural OpenAPI v3; the status schemas are in
`scalerl.operator.status_schema` (named from here too).

Structural schemas (required by apiextensions.k8s.io/v1) have a type at every level and no
`$ref`, `anyOf` of types or `prefixItems`; numeric exclusive bounds are booleans beside
minimum/maximum (OpenAPI 3.0), not numbers (JSON Schema 2020-12, what pydantic writes).
"""

from __future__ import annotations

from typing import Any

from scalerl import spec as _spec
from scalerl.operator.status_schema import PHASES as PHASES
from scalerl.operator.status_schema import status_schema as status_schema
from scalerl.operator.sweep_schema import sweep_status_schema as sweep_status_schema

# The reward field_validator's own regex: pydantic's JSON schema cannot carry a validator.
REWARD_PATTERN = _spec._REWARD.pattern

_KEPT = (
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
)
_NUMERIC_BOUND = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}


class SchemaError(ValueError):
    """scalerl.spec uses a schema construct this converter does not translate."""


def convert(root: dict[str, Any]) -> dict[str, Any]:
    """The structural form of a pydantic JSON schema (its `$defs` inlined)."""
    return _node(root, root.get("$defs", {}))


def _node(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = _node(defs[node["$ref"].rsplit("/", 1)[1]], defs)
        return _with_field_keys(target, node)
    if "anyOf" in node:
        return _with_field_keys(_nullable(node["anyOf"], defs), node)
    if "oneOf" in node and "discriminator" in node:
        return _with_field_keys(_tagged_union(node, defs), node)
    if "oneOf" in node:  # a union told apart by a function (a file or a list of sources)
        return _with_field_keys(_nullable(node["oneOf"], defs), node)
    out: dict[str, Any] = {k: node[k] for k in _KEPT if k in node}
    for key, bound in _NUMERIC_BOUND.items():
        if key in node:
            out[bound], out[key] = node[key], True
    if "const" in node:
        out["enum"] = [node["const"]]
    if node.get("type") == "object":
        _object(node, out, defs)
    if node.get("type") == "array":
        _array(node, out, defs)
    return _with_field_keys(out, node)


def _with_field_keys(out: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    """A field's own description and default win over its type's (a $ref'd model's docstring)."""
    out = dict(out)
    if "description" in field:
        out["description"] = field["description"]
    if "default" in field:
        default = field["default"]
        if default is None:
            out.pop("default", None)  # null defaults are what absence means already
        elif out.get("type") == "object" and "properties" in out and "oneOf" not in field:
            # {} lets the API server fill every nested default, exactly as pydantic does for an
            # absent sub-model; a spelled-out copy would duplicate (and could contradict) them.
            out["default"] = {}
        else:
            out["default"] = default
    return out


def _object(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any]) -> None:
    props = node.get("properties")
    if props is None:
        values = node.get("additionalProperties")
        if values is True:  # free maps (container resources)
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif "patternProperties" in node:  # typed maps with checked keys (node labels)
            # A structural schema cannot check keys: scalerl.spec does, when the operator parses.
            (values,) = node["patternProperties"].values()
            out["additionalProperties"] = _node(values, defs)
        elif isinstance(values, dict):  # typed maps
            out["additionalProperties"] = _node(values, defs)
        return
    out["properties"] = {name: _node(sub, defs) for name, sub in props.items()}
    if node.get("required"):
        out["required"] = list(node["required"])


def _array(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any]) -> None:
    if "prefixItems" in node:  # a fixed-length tuple of one type
        items = [_node(i, defs) for i in node["prefixItems"]]
        if any(i != items[0] for i in items):
            raise SchemaError("tuples of mixed item types have no structural form")
        out["items"] = items[0]
        out["minItems"] = out["maxItems"] = len(items)
    elif "items" in node:
        out["items"] = _node(node["items"], defs)


def _nullable(variants: list[dict[str, Any]], defs: dict[str, Any]) -> dict[str, Any]:
    kept = [v for v in variants if v.get("type") != "null"]
    if len(kept) == 1 and "oneOf" in kept[0] and "discriminator" not in kept[0]:
        kept = kept[0]["oneOf"]  # `(file | sources) | None`
    if [v.get("type") for v in kept] == ["string", "array"]:
        # A file or a list of sources (data.train): a structural schema cannot say "string or
        # array" (no types inside anyOf), so the node keeps any value and scalerl.spec checks
        # it when the operator parses the run (a bad one: Ready=False naming the field).
        out = {"x-kubernetes-preserve-unknown-fields": True}
    elif len(kept) != 1:
        raise SchemaError(f"only `X | None` unions are supported, got {variants}")
    else:
        out = _node(kept[0], defs)
    if len(kept) < len(variants):
        out["nullable"] = True
    return out


def _tagged_union(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A discriminated union as one object: `type` is an enum of the tags, the properties are
    those of every variant, and CEL rules keep each property to the variants that have it.
    Variant defaults that disagree (dapo's epsilonLow 0.2, gspo's 3e-3) cannot be one schema
    default, so variant fields carry none; the parsed spec fills them."""
    tag = node["discriminator"]["propertyName"]
    variants = [_node(v, defs) for v in node["oneOf"]]
    tags = [v["properties"][tag]["enum"][0] for v in variants]
    merged: dict[str, dict[str, Any]] = {}
    owners: dict[str, list[str]] = {}
    for name_tag, variant in zip(tags, variants, strict=True):
        for prop, sub in variant["properties"].items():
            sub = {k: v for k, v in sub.items() if k not in ("default", "description")}
            if prop != tag and prop in merged and merged[prop] != sub:
                raise SchemaError(f"variants disagree on the bounds of {prop}; add a CEL rule")
            merged[prop] = sub
            owners.setdefault(prop, []).append(name_tag)
    merged[tag] = {"type": "string", "enum": tags}
    rules = [
        {
            "rule": f"!has(self.{prop}) || self.{tag} in {_cel_list(names)}",
            "message": f"{prop} applies only to {tag} {', '.join(names)}",
            "fieldPath": f".{prop}",
        }
        for prop, names in owners.items()
        if prop != tag and len(names) < len(tags)
    ]
    descriptions = [
        f"{t}: {v['description']}"
        for t, v in zip(tags, variants, strict=True)
        if "description" in v
    ]
    out: dict[str, Any] = {
        "type": "object",
        "description": f"Tagged by {tag}: {' | '.join(tags)}. " + " ".join(descriptions),
        "required": [tag],
        "properties": merged,
    }
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def _cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"
