"""What a Kubernetes API server does with a CRD's schema, for tests that have none: structural
checks, defaulting, OpenAPI validation (via jsonschema, Draft 4 has OpenAPI 3.0's boolean
exclusive bounds) and CEL rules (via cel-python, when installed).

Simplified where our CRD does not need more: defaults apply to absent properties, recursively;
a null nullable field counts as absent in CEL (as in the API server); transition rules (those
naming oldSelf) run only when an old object is given.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema

FORBIDDEN = ("$ref", "anyOf", "oneOf", "allOf", "not", "prefixItems", "const", "$defs")


def structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """Where the schema breaks the rules of a structural schema (empty when it keeps them)."""
    problems = [f"{path or '/'}: {key} is not structural" for key in FORBIDDEN if key in node]
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path or '/'}: no type")
    if "default" in node:
        errors = list(_validator(node).iter_errors(node["default"]))
        problems += [f"{path}: default {node['default']!r}: {e.message}" for e in errors]
    for name, sub in (node.get("properties") or {}).items():
        problems += structural_problems(sub, f"{path}.{name}")
    if "items" in node:
        problems += structural_problems(node["items"], f"{path}[]")
    return problems


def to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI 3.0 (Kubernetes flavour) -> JSON Schema Draft 4; unknown fields rejected, as a
    strict field validation (kubectl's default) does."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    out.pop("default", None)
    out.pop("format", None)
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node:
        out["properties"] = {k: to_jsonschema(v) for k, v in node["properties"].items()}
        out["additionalProperties"] = False
    if "items" in node:
        out["items"] = to_jsonschema(node["items"])
    return out


def _validator(node: dict[str, Any]) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(to_jsonschema(node))


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in where properties are absent (a copy)."""
    value = copy.deepcopy(value)
    _fill(node, value)
    return value


def _fill(node: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in (node.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _fill(sub, value[name])
    elif isinstance(value, list) and "items" in node:
        for item in value:
            _fill(node["items"], item)


def schema_errors(node: dict[str, Any], value: Any) -> list[str]:
    validator = _validators.get(id(node))
    if validator is None:
        validator = _validators[id(node)] = _validator(node)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '/'}: {e.message}"
        for e in validator.iter_errors(value)
    ]


_validators: dict[int, jsonschema.Draft4Validator] = {}  # by schema identity: the CRD's is fixed


def cel_errors(node: dict[str, Any], value: Any, old: Any = None, path: str = "") -> list[str]:
    """Every CEL rule of the schema evaluated where its node has a value; the failed messages."""
    import celpy

    errors = []
    if value is None:
        return []
    for rule in node.get("x-kubernetes-validations") or []:
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        activation = {"self": celpy.json_to_cel(_cel_view(value))}
        if transition:
            activation["oldSelf"] = celpy.json_to_cel(_cel_view(old))
        if not bool(_program(rule["rule"]).evaluate(activation)):
            errors.append(f"{path or '/'}: {rule['message']}")
    if isinstance(value, dict):
        for name, sub in (node.get("properties") or {}).items():
            prior = old.get(name) if isinstance(old, dict) else None
            errors += cel_errors(sub, value.get(name), prior, f"{path}.{name}")
    return errors


@functools.cache
def _environment() -> Any:
    import celpy

    return celpy.Environment()  # building one compiles CEL's grammar: slow, so only once


@functools.cache
def _program(rule: str) -> Any:
    env = _environment()
    return env.program(env.compile(rule))


def _cel_view(value: Any) -> Any:
    """Null fields dropped: the API server treats a null nullable field as absent in CEL."""
    if isinstance(value, dict):
        return {k: _cel_view(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cel_view(v) for v in value]
    return value


def admit(root: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> Any:
    """What the API server would store for `obj` (defaults applied), or the reasons it refuses
    it: returns (stored, errors)."""
    stored = apply_defaults(root, obj)
    errors = schema_errors(root, stored)
    if not errors:
        try:
            import celpy  # noqa: F401
        except ImportError:
            return stored, []
        errors = cel_errors(root, stored, old)
    return stored, errors
