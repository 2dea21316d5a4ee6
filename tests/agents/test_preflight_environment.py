"""`scalerl validate --deep` with spec.environment: it loads the environment the way a generator
will, and says what is wrong when it cannot."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scalerl.preflight import problems_of
from scalerl.spec import parse_run

ENVIRONMENT = """
import verifiers as vf
from datasets import Dataset


def load_environment(rows: int = 4, with_eval: bool = True, system: str = "Be brief."):
    data = Dataset.from_list([{"question": f"say {i}", "answer": str(i)} for i in range(rows)])
    return vf.SingleTurnEnv(
        dataset=data,
        eval_dataset=data if with_eval else None,
        system_prompt=system,
        rubric=vf.Rubric(funcs=[lambda completion, answer: 1.0]),
    )
"""


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[str]:
    """An environment module on the path, as an installed package would be."""
    (tmp_path / "say_env.py").write_text(textwrap.dedent(ENVIRONMENT))
    sys.path.insert(0, str(tmp_path))
    yield "say-env"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("say_env", None)


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory, build_model: Any, chat_template: str
) -> dict[str, Path]:
    """A model with the chat template, one without, one with a tiny context (built once)."""
    base = tmp_path_factory.mktemp("models")
    return {
        "chat": build_model(base / "chat", chat_template=chat_template, max_positions=256),
        "plain": build_model(base / "plain"),
        "small": build_model(
            base / "small", chat_template="{{ messages[0]['content'] }}", max_positions=64
        ),
    }


def run(model: Path, environment: dict[str, Any], **spec: Any) -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "agent"},
            "spec": {
                "model": {"path": str(model), "thinkEnd": None},
                "environment": environment,
                "recipe": {"length": {"answerBudget": 16, "interruption": {"enabled": False}}},
                **spec,
            },
        }
    )


def test_a_loadable_environment_passes(installed: str, models: dict[str, Path]) -> None:
    assert problems_of(run(models["chat"], {"verifiers": {"id": installed}})) == []


@pytest.mark.parametrize(
    ("environment", "complaint"),
    [
        (
            {"verifiers": {"id": "no-such-env"}},
            "spec.environment.verifiers.id: no installed package",
        ),
        (
            {"verifiers": {"id": "say-env", "args": {"colour": "red"}}},
            "spec.environment.verifiers.args: 'say-env' failed to load",
        ),
        (
            {"verifiers": {"id": "say-env", "args": {"with_eval": False}}},
            "has no eval split (eval_dataset)",
        ),
        ({"verifiers": {"id": "say-env", "args": {"rows": 0}}}, "has no training dataset"),
    ],
)
def test_what_is_wrong_is_said(
    installed: str, models: dict[str, Path], environment: dict[str, Any], complaint: str
) -> None:
    problems = problems_of(run(models["chat"], environment))
    assert any(complaint in p for p in problems), problems


def test_a_model_without_a_chat_template_or_room_is_told(
    installed: str, models: dict[str, Path]
) -> None:
    problems = problems_of(run(models["plain"], {"verifiers": {"id": installed}}))
    assert any("has no chat template" in p for p in problems), problems
    long_system = {"verifiers": {"id": installed, "args": {"system": "x" * 300}}}
    problems = problems_of(run(models["small"], long_system))
    assert any("max_position_embeddings 64" in p for p in problems), problems
