"""Assert tests judged outside the program.

An assert (`assert add(1, 2) == 3`) is split where the program's code begins: the parts that
need it (`add(1, 2)`, "sandbox parts") are evaluated in the sandbox, each value sent back as a
plain, type-tagged value (scalerl.generator.code_judge.decode_value: exact builtin types only, no
subclass, nothing that runs code when compared); the rest of the assert (the comparison, the
expected value, `set(...)`, `sorted(...)`, `math.isclose(...)`, a comprehension over a returned
list) is evaluated here, by Python itself on those genuine values, with the real builtins. So
the expected values never enter the sandbox, an object whose `__eq__` lies never reaches a
comparison, and nothing the program patches in its own process (builtins, the harness, its
report) changes how the comparison is made.

The parts evaluated here see only the names in `SAFE` (and `math`'s functions in `MATH`); any
other name is the program's (or the test's `setup`'s) and makes its smallest enclosing part a
sandbox part. Arithmetic that could grow without bound on a value the program chose (`*`, `**`,
`<<`) is done in the sandbox with its operands.
"""

from __future__ import annotations

import ast
import builtins
import math
import types
from dataclasses import dataclass
from typing import Any

from scalerl.errors import InputError
from scalerl.generator.code_judge import Opaque

SAFE = frozenset(
    "abs all any bool bytes complex dict divmod enumerate filter float frozenset int isinstance "
    "len list map max min range repr reversed round set sorted str sum tuple type zip".split()
)
MATH = frozenset("isclose isnan isinf isfinite fabs floor ceil sqrt inf nan pi e".split())
_GROWING = (ast.Mult, ast.Pow, ast.LShift)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_ENV: dict[str, Any] = {name: getattr(builtins, name) for name in SAFE}
_ENV["math"] = types.SimpleNamespace(**{name: getattr(math, name) for name in MATH})


@dataclass(frozen=True)
class AssertCheck:
    """One assert: what the sandbox evaluates (`parts`, Python expressions), and the rest,
    evaluated here on their values (`judge`)."""

    source: str
    parts: tuple[str, ...]
    template: str  # the assert's test with part i replaced by the name `_part{i}`

    def judge(self, values: list[Any]) -> str:
        """'' when the assert holds for the sandbox parts' `values`, else why not."""
        if len(values) != len(self.parts):
            return f"{len(values)} values for {len(self.parts)} parts"
        for part, value in zip(self.parts, values, strict=True):
            if isinstance(value, Opaque):
                return f"{part} is a {value.name}, not a plain value"
        env = {"__builtins__": {}, **_ENV, **{f"_part{i}": v for i, v in enumerate(values)}}
        try:
            held = eval(self.template, env)  # noqa: S307 — the test's own expression, safe names
        except Exception as err:  # noqa: BLE001 — as the assert would have raised: it failed
            return f"{type(err).__name__}: {err}"[:300]
        return "" if held else f"AssertionError: {self.source}"[:300]


def parse_assert(source: str) -> AssertCheck:
    """The check an assert statement makes; InputError when `source` is not one assert."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise InputError(f"code tests: {source[:80]!r} is not Python: {err.msg}") from err
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise InputError(
            f"code tests: {source[:80]!r} is not a single assert statement (use call-based "
            "tests, fn_name/inputs/outputs, for anything else)"
        )
    parts: list[str] = []
    test = _split(tree.body[0].test, frozenset(), parts)
    return AssertCheck(source, tuple(parts), ast.unparse(test))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _plain_target(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, (ast.Tuple, ast.List)) and all(map(_plain_target, target.elts))


def _outside(node: ast.AST, bound: frozenset[str]) -> bool:
    """Whether `node` can be evaluated here: safe names, names it is given (`bound`: a
    comprehension's or lambda's variables, which hold the program's values: there, no arithmetic
    that could grow without bound), math's safe functions."""
    if isinstance(node, ast.Name):
        return node.id in SAFE or node.id in bound
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "math":
            return node.attr in MATH
        return not node.attr.startswith("_") and _outside(node.value, bound)
    if isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Starred)):
        return False
    if isinstance(node, ast.Lambda):
        given = node.args
        if given.vararg or given.kwarg or given.defaults or given.kw_defaults:
            return False
        names = {a.arg for a in (*given.posonlyargs, *given.args, *given.kwonlyargs)}
        return _outside(node.body, bound | names)
    if isinstance(node, _COMPREHENSIONS):
        inner = bound
        for generator in node.generators:
            if generator.is_async or not _plain_target(generator.target):
                return False
            if not _outside(generator.iter, inner):
                return False
            inner = inner | _names(generator.target)
            if not all(_outside(c, inner) for c in generator.ifs):
                return False
        return all(_outside(p, inner) for p in _results(node))
    if bound and isinstance(node, ast.BinOp) and isinstance(node.op, _GROWING):
        return False
    return all(_outside(child, bound) for child in ast.iter_child_nodes(node))


def _results(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.DictComp):
        return [node.key, node.value]
    assert isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp))
    return [node.elt]


def _safe_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        plain = func.id in SAFE
    else:
        plain = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "math"
            and func.attr in MATH
        )
    starred = any(isinstance(a, ast.Starred) for a in node.args)
    return plain and not starred and all(k.arg is not None for k in node.keywords)


def _split(node: ast.expr, bound: frozenset[str], parts: list[str]) -> ast.expr:
    """`node` with every part that needs the program replaced by a `_part{i}` name, its source
    appended to `parts`. Comparisons, and the calls and comprehensions around a part, stay here."""
    if _outside(node, bound):
        return node
    if isinstance(node, ast.Compare):
        node.left = _split(node.left, bound, parts)
        node.comparators = [_split(c, bound, parts) for c in node.comparators]
        return node
    if isinstance(node, ast.BoolOp):
        node.values = [_split(v, bound, parts) for v in node.values]
        return node
    if isinstance(node, ast.UnaryOp):
        node.operand = _split(node.operand, bound, parts)
        return node
    if isinstance(node, ast.BinOp) and not isinstance(node.op, _GROWING):
        node.left = _split(node.left, bound, parts)
        node.right = _split(node.right, bound, parts)
        return node
    if isinstance(node, ast.Subscript):
        node.value = _split(node.value, bound, parts)
        node.slice = _split(node.slice, bound, parts)
        return node
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        node.elts = [_split(e, bound, parts) for e in node.elts]
        return node
    if isinstance(node, ast.Call) and _safe_call(node):
        node.args = [_split(a, bound, parts) for a in node.args]
        for keyword in node.keywords:
            keyword.value = _split(keyword.value, bound, parts)
        return node
    if isinstance(node, _COMPREHENSIONS) and _splittable(node, bound):
        inner = bound
        for generator in node.generators:
            generator.iter = _split(generator.iter, inner, parts)
            inner = inner | _names(generator.target)
        return node
    if _names(node) & bound:
        raise InputError(
            f"code tests: {ast.unparse(node)[:80]!r} passes a comprehension's variable to the "
            "program's code: it cannot be judged outside the program"
        )
    parts.append(ast.unparse(node))
    return ast.Name(f"_part{len(parts) - 1}", ast.Load())


def _splittable(node: ast.AST, bound: frozenset[str]) -> bool:
    """A comprehension whose conditions and results can be evaluated here once its iterables'
    program parts are values."""
    assert isinstance(node, _COMPREHENSIONS)
    inner = bound
    for generator in node.generators:
        if generator.is_async or not _plain_target(generator.target):
            return False
        inner = inner | _names(generator.target)
        if not all(_outside(c, inner) for c in generator.ifs):
            return False
    return all(_outside(p, inner) for p in _results(node))
