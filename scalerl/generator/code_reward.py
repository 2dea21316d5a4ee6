"""`reward: code`: the program in a completion's answer, run against its row's tests in the
sandbox (scalerl.sandbox); +1 only when every test passes.

The program is the last fenced code block of the answer (```python ... ``` or ``` ... ```), or
the whole answer when it has none. The row's reference (its answer field) holds the tests as JSON
(a Python literal is read too: a JSONL row whose answer is an object arrives as its repr), in one
of the shapes public code datasets use:

- stdin/stdout (APPS, TACO, CodeContests): `{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}`;
  each input is fed to a fresh run of the program, its printed output judged against the output
  (scalerl.generator.code_judge). An input or output may be a list of lines.
- call-based (APPS/TACO with `fn_name`): `{"fn_name": "add", "inputs": [[1, 2], ...], "outputs":
  [3, ...]}`; each input is the argument list of one call of the function (or of the method of a
  `Solution` class), its returned value judged against the output.
- asserts (MBPP, HumanEval-style): `{"asserts": ["assert add(1, 2) == 3", ...]}`, each one assert
  statement; the parts that need the program are evaluated in the sandbox, the comparison here
  (scalerl.generator.code_asserts): each passes when it holds on the values the program gave.
- DeepCoder's list: `[{"input": ..., "output": ..., "type": "stdin_stdout"}, ...]` (or
  `"testtype": "stdin"`; stdin/stdout cases only).

Any shape may add `"tolerance": 1e-6` (numbers compared within it, absolutely or relatively) and
`"setup": "import math"` (code run before the asserts). A reference that is none of these is the
data's fault and raises InputError naming what is wrong.

`score_code` returns the whole record (`CodeVerdict`); `code` is the RewardFn.

Whatever a program does to its sandbox (kills its supervisor, floods it, leaves what cannot be
emptied in time) is its own failure: the test reads SANDBOX_DAMAGED, the reward is -1, and the
next program gets a new sandbox. Only a failure no program could cause (bubblewrap missing or
refused, the host out of memory or processes before the program started) leaves a completion
unscored, and there is one place a caller learns it: `CodeVerdict.unscored`, the reason ('' when
scored; its tests then read UNSCORED and its reward is -1: not passed). `code` raises `Unscored`
(with `.reason`) instead of returning a reward, so no caller trains on it by mistake.
"""

from __future__ import annotations

import ast
import atexit
import json
import re
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerl.errors import InputError, ScaleRLError
from scalerl.generator.code_asserts import AssertCheck, parse_assert
from scalerl.generator.code_judge import as_json, decode_value, same_output, same_value
from scalerl.sandbox import Execution, Limits, PerThread, Sandbox, isolation
from scalerl.spec import CodeSpec

PASSED = "passed"
WRONG_ANSWER = "wrong answer"
RUNTIME_ERROR = "runtime error"
TIMEOUT = "timeout"
MEMORY = "memory"
OUTPUT_TOO_LARGE = "output too large"
NOT_RUN = "not run"  # the problem's time ran out, or an earlier test failed and we stopped
SANDBOX_DAMAGED = "sandbox damaged"  # the program ended or broke its sandbox: it failed
UNSCORED = "unscored"  # the sandbox failed before the program ran: no verdict on the program
_HARNESS = Path(__file__).with_name("code_harness.py").read_text()
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
# How the CPU limit ends a program: SIGKILL at the hard limit (SIGXCPU where it is caught first).
_CPU_LIMIT = (signal.SIGKILL, signal.SIGXCPU)
_STARTUP_SECONDS = 2.0  # interpreter start-up a call-based run gets besides its cases' time


class Unscored(ScaleRLError):
    """The sandbox could not run a program (a failure no program could cause): the completion
    has no reward. `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"unscored: {reason}")
        self.reason = reason


SandboxFailure = Unscored  # the name callers knew it by


@dataclass(frozen=True)
class CodeTests:
    """A row's tests: `kind` is "stdio", "call" or "assert"; `outputs` is empty for asserts."""

    kind: str
    inputs: list[Any]
    outputs: list[Any] = field(default_factory=list)
    fn_name: str = ""
    tolerance: float | None = None
    setup: str = ""


@dataclass(frozen=True)
class TestResult:
    verdict: str  # PASSED or why not
    seconds: float = 0.0
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


@dataclass(frozen=True)
class CodeVerdict:
    """What one program did on its tests. `unscored` is the reason the sandbox could not run it
    ('' when it was scored): then its results say nothing about the program, which counts as
    not passed (reward -1) but must not be trained on. `damaged` says how the program broke its
    sandbox (it failed). `missing` names the sandbox guarantees this machine could not give."""

    tests: list[TestResult]
    unscored: str = ""
    missing: tuple[str, ...] = ()
    damaged: str = ""

    @property
    def scored(self) -> bool:
        return not self.unscored

    @property
    def error(self) -> str:
        """The old name of `unscored`."""
        return self.unscored

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def reward(self) -> float:
        whole = self.tests and self.passed == len(self.tests)
        return 1.0 if whole and not self.unscored and not self.damaged else -1.0

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.tests)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "passed": self.passed,
            "total": len(self.tests),
            "tests": [asdict(t) for t in self.tests],
            "unscored": self.unscored,
            "sandbox_error": self.unscored,
            "damaged": self.damaged,
            "missing_guarantees": list(self.missing),
        }


def extract_code(answer: str) -> str:
    """The last fenced code block of `answer`, or all of it when it has none."""
    blocks = _FENCE.findall(answer)
    return blocks[-1] if blocks else answer


def parse_tests(reference: str) -> CodeTests:
    """The tests a row's reference holds (shapes in the module's doc); InputError when none."""
    data = _decode(reference)
    if isinstance(data, list):
        data = _from_case_list(data)
    if not isinstance(data, dict):
        raise InputError(f"code tests must be a JSON object or list, not {type(data).__name__}")
    tolerance = data.get("tolerance")
    if tolerance is not None and (not isinstance(tolerance, int | float) or tolerance < 0):
        raise InputError(f"code tests: tolerance must be a number >= 0, not {tolerance!r}")
    setup = data.get("setup") or ""
    if not isinstance(setup, str):
        raise InputError("code tests: setup must be a string of code")
    if "asserts" in data:
        asserts = data["asserts"]
        if (
            not isinstance(asserts, list)
            or not asserts
            or not all(isinstance(a, str) for a in asserts)
        ):
            raise InputError("code tests: asserts must be a non-empty list of strings")
        for one in asserts:
            parse_assert(one)  # InputError when it is not one assert statement
        return CodeTests("assert", asserts, tolerance=tolerance, setup=setup)
    inputs, outputs = data.get("inputs"), data.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise InputError("code tests need 'inputs' and 'outputs' lists (or 'asserts')")
    if len(inputs) != len(outputs):
        raise InputError(f"code tests: {len(inputs)} inputs but {len(outputs)} outputs")
    fn_name = data.get("fn_name") or ""
    if fn_name:
        if not isinstance(fn_name, str) or not all(isinstance(i, list) for i in inputs):
            raise InputError("call-based code tests need a fn_name string and argument lists")
        return CodeTests("call", inputs, outputs, fn_name, tolerance, setup)
    return CodeTests(
        "stdio", [_text(i) for i in inputs], [_text(o) for o in outputs], "", tolerance
    )


def _decode(reference: str) -> Any:
    try:
        return json.loads(reference)
    except RecursionError as err:
        raise InputError("code tests are nested too deeply to read") from err
    except ValueError:
        pass
    try:
        return ast.literal_eval(reference)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
        raise InputError(f"code tests are neither JSON nor a Python literal: {err}") from err


def _from_case_list(cases: list[Any]) -> dict[str, Any]:
    inputs, outputs = [], []
    for n, case in enumerate(cases):
        kind = isinstance(case, dict) and (case.get("type") or case.get("testtype") or "stdin")
        if kind not in ("stdin_stdout", "stdin") or "input" not in case or "output" not in case:
            raise InputError(
                f"code tests: case {n} is not a stdin/stdout case with input and output"
            )
        inputs.append(case["input"])
        outputs.append(case["output"])
    return {"inputs": inputs, "outputs": outputs}


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    if not isinstance(value, str):
        raise InputError(f"stdin/stdout code tests hold strings, not {type(value).__name__}")
    return value


# --- scoring ---------------------------------------------------------------------------------


def score_code(
    answer: str,
    reference: str,
    spec: CodeSpec | None = None,
    *,
    stop_early: bool = False,
    sandbox: Sandbox | None = None,
) -> CodeVerdict:
    """Run the answer's program against the reference's tests; the whole record.

    `stop_early` skips the tests after the first failure (they read NOT_RUN): the reward is the
    same and a failing program costs one test's time, not all of them. `sandbox` runs them (one
    kept by the caller: no start-up per program); None: a sandbox of its own."""
    spec = spec or CodeSpec()
    tests = parse_tests(reference)
    program = extract_code(answer)
    if sandbox is None:
        with Sandbox() as own:
            return _score(own, program, tests, spec, stop_early)
    return _score(sandbox, program, tests, spec, stop_early)


def _score(
    sandbox: Sandbox, program: str, tests: CodeTests, spec: CodeSpec, stop_early: bool
) -> CodeVerdict:
    deadline = time.monotonic() + spec.problem_timeout_seconds
    if tests.kind == "stdio":
        return _score_stdio(sandbox, program, tests, spec, deadline, stop_early)
    return _score_calls(sandbox, program, tests, spec, deadline, stop_early)


def _limits(spec: CodeSpec, seconds: float) -> Limits:
    return Limits(
        wall_seconds=seconds,
        cpu_seconds=max(1, int(seconds + 0.999)),
        memory_bytes=spec.memory_mib << 20,
        processes=spec.processes,
        output_bytes=spec.output_mib << 20,
        file_bytes=spec.output_mib << 20,
    )


def _score_stdio(
    sandbox: Sandbox,
    program: str,
    tests: CodeTests,
    spec: CodeSpec,
    deadline: float,
    stop_early: bool,
) -> CodeVerdict:
    results: list[TestResult] = []
    missing: tuple[str, ...] = ()
    damaged = ""
    for given, wanted in zip(tests.inputs, tests.outputs, strict=True):
        left = min(spec.test_timeout_seconds, deadline - time.monotonic())
        if left <= 0 or (stop_early and results and not results[-1].passed):
            results.append(TestResult(NOT_RUN))
            continue
        done = sandbox.run(program, given.encode(), _limits(spec, left))
        missing = done.isolation.missing
        if done.error:
            return _unscored(tests, done)
        damaged = damaged or done.damaged
        failed = _failure(done)
        if failed is None and not same_output(
            done.stdout.decode(errors="replace"), wanted, tests.tolerance
        ):
            failed = TestResult(WRONG_ANSWER, done.wall_seconds, _excerpt(done.stdout))
        results.append(failed or TestResult(PASSED, done.wall_seconds))
    return CodeVerdict(results, "", missing, damaged)


def _unscored(tests: CodeTests, done: Execution) -> CodeVerdict:
    """A verdict on no program: the sandbox failed before it ran (done.error)."""
    results = [TestResult(UNSCORED, detail=done.error) for _ in tests.inputs]
    return CodeVerdict(results, done.error, done.isolation.missing)


def _failure(done: Execution) -> TestResult | None:
    """Why an execution failed before its output could be judged (None: it ran to the end)."""
    seconds = done.wall_seconds
    if done.damaged:
        return TestResult(SANDBOX_DAMAGED, seconds, done.damaged[:300])
    if done.output_exceeded:
        return TestResult(OUTPUT_TOO_LARGE, seconds)
    if done.memory_total_exceeded:
        return TestResult(MEMORY, seconds, "its processes together held more than its limit")
    if done.timed_out or done.cpu_exceeded or done.signal in _CPU_LIMIT:
        return TestResult(TIMEOUT, seconds)
    if done.returncode == 0:
        return None
    if done.memory_exceeded:
        return TestResult(MEMORY, seconds, _last_line(done.stderr))
    return TestResult(RUNTIME_ERROR, seconds, _last_line(done.stderr) or f"exit {done.returncode}")


def _score_calls(
    sandbox: Sandbox,
    program: str,
    tests: CodeTests,
    spec: CodeSpec,
    deadline: float,
    stop_early: bool,
) -> CodeVerdict:
    """Call-based and assert tests: one run of the harness for all cases, each case under the
    per-test time limit, the whole under the problem's."""
    checks = [parse_assert(a) for a in tests.inputs] if tests.kind == "assert" else []
    cases = {
        "kind": tests.kind,
        "cases": [list(c.parts) for c in checks] if checks else tests.inputs,
        "fn_name": tests.fn_name,
        "setup": tests.setup,
        "seconds": spec.test_timeout_seconds,
        "stop_at_failure": stop_early,
    }
    budget = len(tests.inputs) * spec.test_timeout_seconds + _STARTUP_SECONDS
    seconds = min(budget, deadline - time.monotonic())
    done = sandbox.run(
        _HARNESS, json.dumps(cases).encode(), _limits(spec, seconds), {"solution.py": program}
    )
    if done.error:
        return _unscored(tests, done)
    lines = done.stdout.decode(errors="replace").splitlines()
    results: list[TestResult] = []
    for n in range(len(tests.inputs)):
        if stop_early and results and not results[-1].passed:
            results.append(TestResult(NOT_RUN))  # the harness stops at a failure it can see
        elif n < len(lines):
            results.append(_judge_line(lines[n], tests, n, checks))
        elif n == len(lines):  # the case the run died in
            results.append(_failure(done) or TestResult(RUNTIME_ERROR, 0.0, "no result"))
        else:
            results.append(TestResult(NOT_RUN))
    return CodeVerdict(results, "", done.isolation.missing, done.damaged)


def _judge_line(line: str, tests: CodeTests, n: int, checks: list[AssertCheck]) -> TestResult:
    """One case's line of the harness's report, judged here: its values rebuilt as plain
    builtin values, compared with the expected ones (which never entered the sandbox)."""
    try:
        report = json.loads(line)
        seconds = float(report.get("seconds", 0.0))
        if report.get("timeout"):
            return TestResult(TIMEOUT, seconds)
        if "error" in report:
            error = str(report["error"])
            why = MEMORY if error.startswith("MemoryError") else RUNTIME_ERROR
            return TestResult(why, seconds, error[:300])
        if checks:
            values = [decode_value(v) for v in report["values"]]
        else:
            value = as_json(decode_value(report["value"]))
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return TestResult(RUNTIME_ERROR, detail="unreadable result")
    if checks:
        why_not = checks[n].judge(values)
        return (
            TestResult(WRONG_ANSWER, seconds, why_not) if why_not else TestResult(PASSED, seconds)
        )
    if same_value(value, tests.outputs[n], tests.tolerance):
        return TestResult(PASSED, seconds)
    return TestResult(WRONG_ANSWER, seconds, _excerpt(repr(value).encode()))


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def _excerpt(output: bytes) -> str:
    text = output.decode(errors="replace")
    return text if len(text) <= 200 else text[:200] + "..."


def code(answer: str, reference: str) -> float:
    """The `code` RewardFn with the spec's default limits; raises Unscored when the sandbox
    could not run the program."""
    return code_reward(CodeSpec())(answer, reference)


def code_reward(spec: CodeSpec) -> Callable[[str, str], float]:
    """The `code` RewardFn with a run's limits (spec.data.code): +1 when every test passes. Each
    thread that calls it keeps a sandbox, closed when the process exits. Raises
    SandboxUnavailable here, before any program, where no sandbox can be made and the spec does
    not allow plain processes (`isolation.required`)."""
    sandboxes = PerThread(isolation.required(spec.unsafe_allow_plain))
    atexit.register(sandboxes.close)

    def reward(answer: str, reference: str) -> float:
        verdict = score_code(answer, reference, spec, stop_early=True, sandbox=sandboxes.get())
        if verdict.unscored:
            raise Unscored(verdict.unscored)
        return verdict.reward

    return reward


# A problem in each test shape with a right and a wrong program: what `scalerl sandbox-check`
# scores in the sandbox it made, as the generators will, so that a sandbox that starts but cannot
# run the harness fails the check rather than every rollout.
KNOWN_PROBLEMS = {
    "stdin/stdout": (
        '{"inputs": ["1 2\\n", "5 -7\\n"], "outputs": ["3\\n", "-2\\n"]}',
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a - b)\n",
    ),
    "call-based": (
        '{"fn_name": "add", "inputs": [[1, 2], [5, -7]], "outputs": [3, -2]}',
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a - b\n",
    ),
    "asserts": (
        '{"asserts": ["assert add(1, 2) == 3", "assert sorted([add(5, -7)]) == [-2]"]}',
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a - b\n",
    ),
}


def known_scores(sandbox: Sandbox, spec: CodeSpec | None = None) -> dict[str, tuple[float, float]]:
    """The reward of KNOWN_PROBLEMS' right and wrong program for each test shape, scored in
    `sandbox` ((1.0, -1.0) each where the harness works there). Raises Unscored with the reason
    where the sandbox could not run one."""
    scores = {}
    for shape, (reference, right, wrong) in KNOWN_PROBLEMS.items():
        verdicts = [score_code(p, reference, spec, sandbox=sandbox) for p in (right, wrong)]
        for verdict in verdicts:
            if verdict.unscored:
                raise Unscored(f"{shape}: {verdict.unscored}")
        scores[shape] = (verdicts[0].reward, verdicts[1].reward)
    return scores
