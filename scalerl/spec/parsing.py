"""Reading a resource at the edge: a YAML file, and one line per problem of a resource that does
not validate (the field's YAML path, what is wrong, what is allowed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from scalerl.errors import InputError, SpecError
from scalerl.spec.base import _AT, _Resource
from scalerl.spec.data import _FILE, _SOURCES
from scalerl.spec.recipe import LOSS_TYPES

T = TypeVar("T")


def _load(path: str | Path, parse: Callable[[Any], T]) -> T:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"{path}: cannot read spec file ({err.strerror})") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML ({err})") from None
    try:
        return parse(obj)
    except SpecError as err:
        raise SpecError([f"{path}: {p}" for p in err.problems]) from None


def _problems(err: ValidationError, kind: type[_Resource]) -> list[str]:
    """One line per problem; a key at the top level that is not one of the object's is named
    with where it belongs, when that is clear."""
    return [
        _misplaced(str(e["loc"][0]), kind)
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1
        else _describe(e)
        for e in err.errors()
    ]


def _misplaced(key: str, kind: type[_Resource]) -> str:
    """`key` at the top of a `kind` document, and the field it most likely meant."""
    where = _home_of(key, kind)
    hint = f"; did you mean {where}? (move it under {where.rpartition('.')[0]})" if where else ""
    return (
        f"{key}: not a top-level field of a {kind.__name__} (those are apiVersion, kind, "
        f"metadata, spec and status){hint}"
    )


def _home_of(key: str, kind: type[_Resource]) -> str | None:
    """Where `key` (in any case, camelCase or snake_case) is a field below the top, or None."""
    spec: Any = kind.model_fields["spec"].annotation
    homes = [("metadata", ["name", "namespace", "labels", "annotations"]), ("spec", _fields(spec))]
    homes += [(prefix, _fields(model)) for prefix, model in kind.nested_homes]
    wanted = key.replace("_", "").lower()
    for prefix, fields in homes:
        for field in fields:
            if field.lower() == wanted:
                return f"{prefix}.{field}"
    return None


def _fields(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _describe(error: Any) -> str:
    """One line per problem: the field's YAML path, then what is wrong and what is allowed."""
    loc = [str(p) for p in error["loc"] if not _is_variant_tag(p, error)]
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "union_tag_invalid":
        loc.append(ctx["discriminator"].strip("'"))
        return f"{'.'.join(loc)}: {ctx['tag']!r} is not one of {', '.join(LOSS_TYPES)}"
    if kind == "union_tag_not_found":
        loc.append(ctx["discriminator"].strip("'"))
        return f"{'.'.join(loc)}: required field is missing (one of {', '.join(LOSS_TYPES)})"
    if kind == "literal_error":
        allowed = ctx["expected"].replace("'", "").replace(" or ", ", ")
        return f"{'.'.join(loc)}: {value!r} is not one of {allowed}"
    if kind == "extra_forbidden":
        return f"{'.'.join(loc)}: unknown field (check spelling; fields are camelCase)"
    if kind == "missing":
        return f"{'.'.join(loc)}: required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    where = ".".join(loc) or "object"
    if message.startswith(_AT):  # a model validator naming a field below its model
        below, _, message = message[len(_AT) :].partition(": ")
        where = f"{where}.{below}"
    return f"{where}: {message}" + ("" if kind == "value_error" else f", got {value!r}")


def _is_variant_tag(part: Any, error: Any) -> bool:
    # pydantic puts the chosen union member's tag in the location ("loss.cispo.epsilonMax").
    if part in (_FILE, _SOURCES):
        return True
    return isinstance(part, str) and part in LOSS_TYPES and error["type"] != "union_tag_invalid"
