"""Queries over stored objects: label selectors, field selectors and printer-column JSONPaths.

Label selectors follow the Kubernetes syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
`a notin (x,y)`, `a` (exists), `!a` (absent), joined by commas (all must hold).
Field selectors are equality-based over dotted paths (`metadata.name=x`, `status.phase!=Running`).
JSONPaths cover what printer columns use: `.a.b`, `.a[0]`, `.a[*].b`, `.a[?(@.type=="Ready")].b`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([^\s!=()]+)\s*(==|!=|=)\s*([^\s!=()]*)\s*$")
_KEY_RE = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")


class SelectorError(ValueError):
    pass


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside `( … )`."""
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if match := _SET_RE.match(term):
        key, op, raw = match.groups()
        values = {value.strip() for value in raw.split(",") if value.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _CMP_RE.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _KEY_RE.match(term):
        negated, key = match.groups()
        return lambda labels: (key in labels) != bool(negated)
    raise SelectorError(f"unable to parse requirement: {term!r}")


def label_selector(text: str) -> Predicate:
    """A predicate over whole objects that checks their `metadata.labels`."""
    checks = [_label_term(term) for term in _split_terms(text)]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _field_term(term: str) -> Predicate:
    match = _CMP_RE.match(term)
    if not match:
        raise SelectorError(f"invalid field selector: {term!r}")
    path, op, value = match.groups()
    if op == "!=":
        return lambda obj: _field_value(obj, path) != value
    return lambda obj: _field_value(obj, path) == value


def field_selector(text: str) -> Predicate:
    checks = [_field_term(term) for term in _split_terms(text)]
    return lambda obj: all(check(obj) for check in checks)


# JSONPath tokens: `.name` (dots in names escaped as `\.`), `['name']`, `[3]`, `[*]`, `[?(…)]`.
_TOKEN_RE = re.compile(
    r"\.((?:\\.|[^.\[\\])+)|\['([^']*)'\]|\[(-?\d+)\]|\[(\*)\]|\[\?\(@\.([^=!]+?)\s*(==|!=)\s*(.+?)\)\]"
)


def _parse_literal(raw: str) -> Any:
    raw = raw.strip()
    if raw[:1] in "'\"" and raw[-1:] == raw[:1]:
        return raw[1:-1]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _filter_step(items: list[Any], path: str, op: str, literal: Any) -> list[Any]:
    selected = []
    for item in items:
        found = jsonpath(item, "." + path)
        equal = bool(found) and found[0] == literal
        if equal == (op == "=="):
            selected.append(item)
    return selected


def _step(values: list[Any], token: re.Match[str]) -> list[Any]:
    name, quoted, index, star, fpath, fop, flit = token.groups()
    if name is not None or quoted is not None:
        key = quoted if quoted is not None else name.replace("\\.", ".")
        return [v[key] for v in values if isinstance(v, Mapping) and key in v]
    lists = [v for v in values if isinstance(v, list)]
    if index is not None:
        return [v[int(index)] for v in lists if -len(v) <= int(index) < len(v)]
    if star is not None:
        return [item for v in lists for item in v]
    return [item for v in lists for item in _filter_step(v, fpath, fop, _parse_literal(flit))]


def jsonpath(obj: Any, path: str) -> list[Any]:
    """All values at a JSONPath (`{…}` braces and a leading `$` are accepted)."""
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    values, position = [obj], 0
    while position < len(path):
        token = _TOKEN_RE.match(path, position)
        if token is None:
            raise SelectorError(f"unsupported JSONPath {path!r} at {position}")
        values, position = _step(values, token), token.end()
    return values
