"""The program a call-based or assert test runs in the sandbox (as its main.py): it reads the
cases as JSON on stdin, loads the solution (solution.py) without running its `__main__` part,
then runs each case under its own time limit and prints one JSON line per case: `{"value": ...}`
(what the function returned), `{"ok": true}` (an assert held), `{"error": "..."}` or
`{"timeout": true}`. With `"stop_at_failure"`, the run ends after the first case that raised or
ran out of time (a case whose value is wrong is judged outside, and costs little to go on from):
a program that loops costs one case's time, not every case's.

The expected values of call-based tests never enter the sandbox (the judge compares outside it).
Asserts carry theirs inside, and run in the solution's own process: no file holds them, but a
program written to dig them out of this harness's memory, or to forge its report, could. Not
imported by scalerl; standard library only.
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


def _plain(value: Any) -> Any:
    """`value` as JSON can carry it: tuples and sets as lists, anything else as its repr."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _run(case: Any, namespace: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "call":
        return {"value": _plain(_function(namespace, spec["fn_name"])(*case))}
    exec(compile(case, "<assert>", "exec"), namespace)
    return {"ok": True}


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
        except (TypeError, ValueError):
            text = json.dumps({"value": repr(line.get("value"))})
        report.write(text + "\n")
        report.flush()
        if spec.get("stop_at_failure") and ("error" in line or "timeout" in line):
            break
    sys.stdout.flush()


main()
