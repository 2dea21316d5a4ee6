"""With `reward: code`, `scalerl validate --deep` checks that every row holds tests, naming the
rows that do not (a bad row found mid-run would stop the run), and that the sandbox can be made:
model-written code never runs unsandboxed unless the spec says so by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_preflight import problems, run_of

from scalerl.errors import SandboxUnavailable
from scalerl.generator.code_reward import score_code
from scalerl.generator.scoring import Scorer
from scalerl.sandbox import isolation
from scalerl.spec import CodeSpec

GOOD = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})


def _write(tmp_path: Path, answers: list[str]) -> Path:
    rows = [{"question": f"task {i}", "solution": a} for i, a in enumerate(answers)]
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_with_tests_pass_and_rows_without_are_named(user_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = user_model()
    good = _write(tmp_path, [GOOD] * 20)
    assert problems(run_of(model, good, data={"reward": "code"})) == []
    answers = [GOOD] * 20
    answers[3] = "42"
    answers[7] = json.dumps({"inputs": ["1"], "outputs": []})
    found = problems(run_of(model, _write(tmp_path, answers), data={"reward": "code"}))
    assert found == [
        f"spec.data.answerField: {tmp_path / 'code.jsonl'}:4: code tests must be a JSON object "
        "or list, not int",
        f"spec.data.answerField: {tmp_path / 'code.jsonl'}:8: code tests: 1 inputs but 0 outputs",
    ]


def test_many_bad_rows_are_counted_after_the_first_five(user_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    train = _write(tmp_path, ["not tests"] * 12)
    found = problems(run_of(user_model(), train, data={"reward": "code"}))
    assert len(found) == 6 and found[-1] == "spec.data.answerField: 7 more rows without code tests"


# --- the sandbox: never silently plain ---------------------------------------------------------


@pytest.fixture
def no_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as one without bubblewrap: the probe finds no sandbox (cached per process,
    so cleared around the test)."""
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    isolation.probe.cache_clear()
    yield
    isolation.probe.cache_clear()


def test_a_code_run_where_no_sandbox_can_be_made_is_refused_before_it_starts(
    user_model, tmp_path: Path, no_bubblewrap: None
) -> None:  # type: ignore[no-untyped-def]
    run = run_of(user_model(), _write(tmp_path, [GOOD] * 20), data={"reward": "code"})
    found = problems(run)
    assert len(found) == 1
    assert found[0].startswith(
        "spec.data.reward: code: no sandbox for model-written code: bubblewrap (bwrap) is not "
        "installed."
    )
    assert "unsafeAllowPlain: true" in found[0] and "sandboxed runtime class" in found[0]
    run["spec"]["data"]["code"] = {"unsafeAllowPlain": True}
    assert problems(run) == []  # asked for by name


def test_a_generator_refuses_to_score_code_unsandboxed_unless_the_spec_allows_it(
    no_bubblewrap: None,
) -> None:
    with pytest.raises(SandboxUnavailable, match="bubblewrap \\(bwrap\\) is not installed"):
        Scorer("code", CodeSpec())
    with pytest.raises(SandboxUnavailable):
        score_code("print(3)", GOOD)  # a sandbox of its own: refused too
    scorer = Scorer("code", CodeSpec.model_validate({"unsafeAllowPlain": True}))
    try:
        adds = "```python\nprint(sum(map(int, input().split())))\n```"
        verdict = scorer.score_program(adds, GOOD)
    finally:
        scorer.close()
    assert verdict == 1.0


def test_validate_deep_names_the_missing_sandbox_from_the_path_it_runs_with(
    user_model, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The CLI a user runs, in a process whose PATH holds no bwrap (a machine without it)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    run = run_of(user_model(), _write(tmp_path, [GOOD] * 20), data={"reward": "code"})
    spec = tmp_path / "code.yaml"
    spec.write_text(yaml.safe_dump(run))
    done = subprocess.run(
        [sys.executable, "-m", "scalerl.cli", "validate", "--deep", str(spec)],
        capture_output=True, text=True, env={**os.environ, "PATH": str(bare)}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "error: spec.data.reward: code: no sandbox for model-written code: bubblewrap" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
