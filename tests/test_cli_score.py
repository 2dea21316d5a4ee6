"""`scalerl score` run as a user runs it: the reward of one answer, for every kind of reward, and
for code each test's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCALERL = [sys.executable, "-m", "scalerl.cli"]


def _score(tmp_path: Path, reward: str, answer: str, reference: str, *extra: str):  # type: ignore[no-untyped-def]
    (tmp_path / "answer.txt").write_text(answer)
    (tmp_path / "reference.txt").write_text(reference)
    argv = ["score", "--reward", reward, "--answer", str(tmp_path / "answer.txt")]
    argv += ["--reference", str(tmp_path / "reference.txt"), *extra]
    return subprocess.run(
        [*SCALERL, *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_code_prints_the_reward_and_each_tests_verdict(tmp_path: Path) -> None:
    reference = json.dumps({"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]})
    answer = (
        "Sum them:\n```python\na, b = map(int, input().split())\nprint(a + b if a < 9 else a)\n```"
    )
    done = _score(tmp_path, "code", answer, reference)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "reward -1" and lines[1] == "1/2 tests passed"
    assert lines[2].startswith("  test 0: passed") and lines[3].startswith("  test 1: wrong answer")
    as_json = json.loads(_score(tmp_path, "code", answer, reference, "--json").stdout)
    assert as_json["reward"] == -1.0 and as_json["passed"] == 1 and as_json["total"] == 2
    assert [t["verdict"] for t in as_json["tests"]] == ["passed", "wrong answer"]


@pytest.mark.parametrize(
    ("reward", "answer", "reference", "expected"),
    [
        ("exact", " yes \n", "yes", 1.0),
        ("exact", "no", "yes", -1.0),
        ("math", "\\frac{1}{2}", "0.5", 1.0),
        ("math", "3", "4", -1.0),
    ],
)
def test_every_builtin_reward_scores_from_the_command_line(
    tmp_path: Path, reward: str, answer: str, reference: str, expected: float
) -> None:
    done = _score(tmp_path, reward, answer, reference, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"reward": expected}


def test_a_module_function_reward_and_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_reward.py").write_text(
        "def longer(answer, reference):\n    return 1.0 if len(answer) > len(reference) else -1.0\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = _score(tmp_path, "my_reward:longer", "abcd", "ab")
    assert done.returncode == 0 and done.stdout.strip() == "reward +1"
    bad = _score(tmp_path, "code", "print(1)", "not tests")
    assert bad.returncode == 2 and "neither JSON nor a Python literal" in bad.stderr
    missing = subprocess.run(
        [*SCALERL, "score", "--reward", "exact", "--answer", "/no/such", "--reference", "/no/such"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "error: --answer /no/such" in missing.stderr
