"""The program a call-based or assert test runs in the sandbox (as its main.py): it reads the
cases as JSON on stdin, loads the solution (solution.py) without running its `__main__` part,
then runs each case under its own time limit and prints one JSON line per case: `{"value": V}`
(what the function returned), `{"values": [V, ...]}` (an assert's sandbox parts, see
scalerl/generator/code_asserts.py), `{"error": "..."}` or `{"timeout": true}`; each V a
type-tagged plain value (`tag`). With `"stop_at_failure"`, the run ends after the first case that
raised or ran out of time (a wrong value is judged outside, and costs little to go on from): a
program that loops costs one case's time, not every case's.

Nothing here is trusted: it runs in the solution's own process, which may rewrite it, its
report, or the builtins it uses. It only computes values; no expected value ever enters the
sandbox and every comparison is made outside (scalerl.generator.code_reward), on values rebuilt
from these tags as genuine builtin objects. A forged report can only claim values the program
could have returned anyway. Not imported by scalerl; standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any


class _TimeUp(BaseException):
    """Raised in the case that overran its time (a BaseException, so `except Exception` in the
    solution does not swallow it)."""


def _time_up(signum: int, frame: FrameType | None) -> None:
    raise _TimeUp


def _load(path: str) -> dict[str, Any]:
    """The solution's module namespace, as `runpy.run_path(path, run_name="solution")` makes it
    (its `if __name__ == "__main__":` part not run), without runpy's imports (~5 ms a program)."""
    with open(path, "rb") as file:
        code = compile(file.read(), path, "exec")
    namespace: dict[str, Any] = {"__name__": "solution", "__file__": path}
    exec(code, namespace)
    return namespace


def _function(namespace: dict[str, Any], name: str) -> Any:
    """A module-level function, or a method of a `Solution` class (LeetCode's shape)."""
    if name in namespace and callable(namespace[name]):
        return namespace[name]
    holder = namespace.get("Solution")
    if isinstance(holder, type) and callable(getattr(holder, name, None)):
        return getattr(holder(), name)
    raise NameError(f"the solution defines no function {name!r}")


_type, _list, _len, _repr = type, list, len, repr  # bound before the solution loads
_DEEPEST = 100


def tag(value: Any, depth: int = 0) -> Any:
    """`value` as a JSON list `[tag, ...]` naming its exact builtin type; anything else (a
    subclass too) as `["o", type name]`, which the judge takes for a wrong value."""
    kind = _type(value)
    if depth > _DEEPEST:
        return ["o", "a value nested too deeply"]
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value is True]
    if kind is int:
        return ["i", int.__format__(value, "x")]
    if kind is float:
        return ["f", float.__repr__(value)]
    if kind is complex:
        return ["c", float.__repr__(value.real), float.__repr__(value.imag)]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", bytes.hex(value)]
    if kind in (list, tuple, set, frozenset):
        marks: dict[Any, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
        mark = marks[kind]
        return [mark, [tag(item, depth + 1) for item in _list(value)]]
    if kind is dict:
        return ["d", [[tag(k, depth + 1), tag(v, depth + 1)] for k, v in dict.items(value)]]
    try:
        name = _repr(kind)[:100]
    except Exception:  # noqa: BLE001 — a type whose repr raises is still not a plain value
        name = "?"
    return ["o", name if _type(name) is str else "?"]


def _run(case: Any, namespace: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "call":
        return {"value": tag(_function(namespace, spec["fn_name"])(*case))}
    values = []
    for part in case:  # an assert's parts that need the solution, in order
        values.append(tag(eval(compile(part, "<assert>", "eval"), namespace)))
    return {"values": values}


def main() -> None:
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the solution prints goes to stderr, not into the report
    # The cases come on stdin, read before the solution loads: no file the solution could read
    # them from (asserts hold their expected values). The solution gets an empty stdin.
    spec = json.load(sys.stdin)
    sys.stdin = open(os.devnull)  # noqa: SIM115 — the solution's stdin for the whole run
    signal.signal(signal.SIGALRM, _time_up)
    try:
        namespace = _load("solution.py")
        if spec.get("setup"):
            exec(compile(spec["setup"], "<setup>", "exec"), namespace)
    except BaseException as err:  # noqa: BLE001 — a solution that does not load fails every case
        failed = {"error": f"{type(err).__name__}: {err}"[:500]}
        for _ in spec["cases"]:
            report.write(json.dumps(failed) + "\n")
        return
    for case in spec["cases"]:
        line: dict[str, Any]
        signal.setitimer(signal.ITIMER_REAL, spec["seconds"])
        started = time.perf_counter()
        try:
            line = _run(case, namespace, spec)
        except _TimeUp:
            line = {"timeout": True}
        except BaseException as err:  # noqa: BLE001 — the case failed; the next one still runs
            line = {"error": f"{type(err).__name__}: {err}"[:500]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        line["seconds"] = time.perf_counter() - started
        try:
            text = json.dumps(line)
        except (TypeError, ValueError, RecursionError):
            text = json.dumps({"error": "the returned value could not be sent"})
        report.write(text + "\n")
        report.flush()
        if spec.get("stop_at_failure") and ("error" in line or "timeout" in line):
            break
    sys.stdout.flush()


main()
