"""`reward: code` on real problem shapes: correct, wrong, slow and crashing programs, scored
against expected answers the test computes itself."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from scalerl.errors import InputError
from scalerl.generator.code_reward import (
    MEMORY,
    NOT_RUN,
    PASSED,
    RUNTIME_ERROR,
    TIMEOUT,
    UNSCORED,
    WRONG_ANSWER,
    Unscored,
    extract_code,
    parse_tests,
    score_code,
)
from scalerl.generator.rewards import load_reward
from scalerl.sandbox import isolation
from scalerl.spec import CodeSpec

FAST = CodeSpec(test_timeout_seconds=1.0, problem_timeout_seconds=20.0, memory_mib=256)


def _sum_and_max_problem(seed: int, cases: int = 3) -> tuple[str, list[list[list[int]]]]:
    """stdin: n lines of integers; stdout: each line's sum and max. Expected by hand below."""
    rng = random.Random(seed)
    tests = [[[rng.randint(-50, 50) for _ in range(rng.randint(1, 6))] for _ in range(4)]]
    tests += [[[rng.randint(-9, 9)] for _ in range(2)] for _ in range(cases - 1)]
    inputs = [f"{len(t)}\n" + "".join(" ".join(map(str, row)) + "\n" for row in t) for t in tests]
    outputs = ["".join(f"{sum(row)} {max(row)}\n" for row in t) for t in tests]
    return json.dumps({"inputs": inputs, "outputs": outputs}), tests


SUM_MAX = """```python
n = int(input())
for _ in range(n):
    row = list(map(int, input().split()))
    total, best = 0, row[0]
    for v in row:
        total += v
        best = v if v > best else best
    print(total, best)
```"""


def test_a_correct_stdin_program_passes_every_test() -> None:
    reference, _ = _sum_and_max_problem(1)
    answer = "Here is my solution.\n```\nprint('draft')\n```\nFinal:\n" + SUM_MAX
    verdict = score_code(answer, reference, FAST)
    assert [t.verdict for t in verdict.tests] == [PASSED] * 3 and verdict.reward == 1.0


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        ("print(total, best + 1)", WRONG_ANSWER),
        ("print(total, best, row[99])", RUNTIME_ERROR),
        ("import time; time.sleep(30)", TIMEOUT),
        ("block = bytearray(1 << 40)", MEMORY),
    ],
)
def test_wrong_crashing_slow_and_greedy_programs_fail_with_their_reason(
    body: str, verdict: str
) -> None:
    reference, _ = _sum_and_max_problem(2)
    answer = SUM_MAX.replace("print(total, best)", body)
    result = score_code(answer, reference, FAST)
    assert result.reward == -1.0 and result.passed == 0
    assert {t.verdict for t in result.tests} == {verdict}


def test_stop_early_skips_the_tests_after_the_first_failure() -> None:
    reference, tests = _sum_and_max_problem(3)
    # Right only when there is one number per line: the first test (several) fails.
    answer = "n = int(input())\nfor _ in range(n):\n    v = int(input())\n    print(v, v)\n"
    full = score_code(answer, reference, FAST)
    assert [t.verdict for t in full.tests] == [RUNTIME_ERROR, PASSED, PASSED]
    early = score_code(answer, reference, FAST, stop_early=True)
    assert [t.verdict for t in early.tests] == [RUNTIME_ERROR, NOT_RUN, NOT_RUN]
    assert len(tests[0][0]) > 1 or len(tests[0][1]) > 1


def _longest_run(values: list[int]) -> int:
    return max((len(list(g)) for _, g in itertools.groupby(values)), default=0)


def _call_problem() -> tuple[str, list[int]]:
    rng = random.Random(4)
    args = [[[rng.randint(0, 2) for _ in range(rng.randint(0, 12))]] for _ in range(5)]
    expected = [_longest_run(a[0]) for a in args]
    return json.dumps({"fn_name": "longest_run", "inputs": args, "outputs": expected}), expected


LONGEST = """
def longest_run(values):
    best = run = 0
    for i, v in enumerate(values):
        run = run + 1 if i and values[i - 1] == v else 1
        best = max(best, run)
    return best
"""


@pytest.mark.parametrize(
    ("program", "verdicts"),
    [
        (LONGEST, [PASSED] * 5),
        ("class Solution:\n    def longest_run(self, values):\n        return " + "0", None),
        (LONGEST.replace("max(best, run)", "run"), None),
        ("def longest_run(values):\n    while True:\n        pass\n", [TIMEOUT] * 5),
        ("def longest_run(values):\n    return values[0]\n", None),
        ("import sys\nsys.exit(3)\n", [RUNTIME_ERROR] * 5),
    ],
)
def test_call_based_programs_are_judged_on_their_returned_values(
    program: str, verdicts: list[str] | None
) -> None:
    reference, expected = _call_problem()
    spec = CodeSpec(test_timeout_seconds=0.3, problem_timeout_seconds=20.0)
    result = score_code(program, reference, spec)
    if verdicts is None:  # right exactly where its own logic happens to agree
        namespace: dict[str, object] = {}
        exec(program, namespace)
        fn = namespace.get("longest_run") or namespace["Solution"]().longest_run  # type: ignore[operator]
        args = json.loads(reference)["inputs"]
        verdicts = []
        for a, want in zip(args, expected, strict=True):
            try:
                verdicts.append(PASSED if fn(*a) == want else WRONG_ANSWER)  # type: ignore[operator]
            except IndexError:
                verdicts.append(RUNTIME_ERROR)
    assert [t.verdict for t in result.tests] == verdicts
    assert result.reward == (1.0 if verdicts == [PASSED] * 5 else -1.0)


def test_stop_early_ends_a_looping_program_at_its_first_case() -> None:
    reference, _ = _call_problem()
    spec = CodeSpec(test_timeout_seconds=0.5, problem_timeout_seconds=20.0)
    looping = "def longest_run(values):\n    while True:\n        pass\n"
    full = score_code(looping, reference, spec)
    early = score_code(looping, reference, spec, stop_early=True)
    assert [t.verdict for t in full.tests] == [TIMEOUT] * 5
    assert [t.verdict for t in early.tests] == [TIMEOUT] + [NOT_RUN] * 4
    # The harness ran one case of 0.5 s, not five: its CPU went to one.
    assert early.seconds < 1.0 < full.seconds
    wrong_first = LONGEST.replace("return best", "return best if len(values) > 3 else -1")
    verdicts = [t.verdict for t in score_code(wrong_first, reference, spec, stop_early=True).tests]
    first_wrong = verdicts.index(WRONG_ANSWER)
    assert verdicts[first_wrong + 1 :] == [NOT_RUN] * (4 - first_wrong)


def test_assert_tests_with_setup() -> None:
    reference = json.dumps(
        {
            "setup": "import math",
            "asserts": ["assert hyp(3, 4) == 5", "assert math.isclose(hyp(1, 1), 2 ** 0.5)"],
        }
    )
    good = "def hyp(a, b):\n    return (a * a + b * b) ** 0.5\n"
    assert score_code(good, reference, FAST).reward == 1.0
    bad = score_code("def hyp(a, b):\n    return a + b\n", reference, FAST)
    assert [t.verdict for t in bad.tests] == [WRONG_ANSWER, WRONG_ANSWER]


def test_tolerance_and_the_deepcoder_list_shape_given_as_a_python_literal() -> None:
    cases = [
        {"input": f"{n}\n", "output": f"{1 / n:.9f}\n", "type": "stdin_stdout"} for n in (3, 7)
    ]
    reference = repr(
        {
            "inputs": [c["input"] for c in cases],
            "outputs": [c["output"] for c in cases],
            "tolerance": 1e-6,
        }
    )
    assert score_code("print(1 / int(input()))", reference, FAST).reward == 1.0
    assert score_code("print(round(1 / int(input()), 3))", reference, FAST).reward == -1.0
    deepcoder = json.dumps(cases)
    assert parse_tests(deepcoder).kind == "stdio"
    assert score_code("print(f'{1 / int(input()):.9f}')", deepcoder, FAST).reward == 1.0


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("not tests", "neither JSON nor a Python literal"),
        ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
        ('{"asserts": []}', "asserts must be a non-empty list"),
        ('[{"input": "1", "output": "1", "testtype": "functional"}]', "case 0 is not a stdin"),
        ('{"inputs": ["1"], "outputs": ["1"], "tolerance": -1}', "tolerance must be a number"),
        ("42", "must be a JSON object or list"),
    ],
)
def test_bad_references_name_what_is_wrong(reference: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_tests(reference)


def test_extract_code_takes_the_last_fenced_block_or_everything() -> None:
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("print(1)") == "print(1)"


def test_the_code_reward_resolves_and_a_sandbox_that_cannot_start_leaves_it_unscored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference, _ = _sum_and_max_problem(5)
    reward = load_reward("code", FAST)
    assert reward(SUM_MAX, reference) == 1.0 and load_reward("code")(SUM_MAX, reference) == 1.0
    if isolation.probe().mode != "bwrap":
        pytest.skip("breaks bubblewrap on purpose; this machine runs without it")
    broken = ["bwrap", "--no-such-option"]
    monkeypatch.setattr(isolation, "bwrap_argv", lambda python, fresh=True, proc=True: broken)
    verdict = score_code(SUM_MAX, reference, FAST)
    # No program could have caused it: unscored, with the reason, in one place.
    assert verdict.unscored.startswith("the sandbox did not start") and not verdict.scored
    assert [t.verdict for t in verdict.tests] == [UNSCORED] * 3 and verdict.reward == -1.0
    assert verdict.to_dict()["unscored"] == verdict.unscored
    with pytest.raises(Unscored) as raised:  # a reward loaded now starts its sandbox broken
        load_reward("code", FAST)(SUM_MAX, reference)
    assert raised.value.reason.startswith("the sandbox did not start")


def test_an_assert_solution_finds_no_file_holding_its_expected_values() -> None:
    reference = json.dumps({"asserts": ["assert secret() == 'kiwi'"]})
    # A cheat: return the value the assert expects, read from wherever the tests are kept.
    cheat = (
        "import glob, re\n"
        "found = [open(p).read() for p in glob.glob('*') + glob.glob('/tmp/*') if p != 'main.py']\n"
        "hits = [m for text in found for m in re.findall(r\"== '(\\w+)'\", text)]\n"
        "def secret():\n"
        "    return hits[0]\n"
    )
    verdict = score_code(cheat, reference, FAST)
    assert [t.verdict for t in verdict.tests] == [RUNTIME_ERROR]
    assert "IndexError" in verdict.tests[0].detail
