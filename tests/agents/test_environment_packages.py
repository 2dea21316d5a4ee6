"""The two verifiers environment packages in environments/, installed and loaded as a user would
(`pip install -e`, then `vf.load_environment`), and played through verifiers' own rollout loop
with a scripted model: no model, no vLLM, no network."""

from __future__ import annotations

import asyncio
import importlib
import re
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted import scripted_response

from scalerl.demo import tool_task as builtin

QUESTION = re.compile(r"^What is (\d+)\*(\d+)\?$")


@pytest.fixture(scope="session")
def vf(environment_packages: list[str]) -> ModuleType:
    """verifiers, with both packages pip-installed into this venv (tests/agents/conftest.py)."""
    import verifiers

    return verifiers


@pytest.fixture(scope="session")
def calculate(vf: ModuleType) -> Any:
    return importlib.import_module("tool_arith").calculate


# --- a scripted model behind verifiers' client interface -----------------------------------------


def scripted_client(vf: ModuleType, replies: list[dict[str, Any]]) -> Any:
    """A vf client that answers each model turn with the next of `replies` and records the
    prompts it was sent."""

    class Scripted(vf.Client):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__(object())
            self.prompts: list[Any] = []
            self.tools: list[Any] = []

        def setup_client(self, config: Any) -> Any:
            return object()

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
            return messages, {}

        async def get_native_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
        ) -> Any:
            self.prompts.append(prompt)
            self.tools.append(tools)
            return scripted_response(replies[len(self.prompts) - 1], model, "call_")

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return Scripted()


def play(env: Any, row: dict[str, Any], client: Any) -> Any:
    rollout_input = {k: row[k] for k in ("prompt", "example_id", "answer", "info") if k in row}
    return asyncio.run(env.run_rollout(rollout_input, client, "scripted", {}))


def text(message: dict[str, Any]) -> Any:
    return message["content"]


def roles(completion: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in completion]


# --- tool-arith ----------------------------------------------------------------------------------


def test_tool_arith_loads_by_its_id_with_disjoint_splits_of_the_asked_sizes(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith", num_train=300, num_eval=40, seed=3)
    assert isinstance(env, vf.ToolEnv) and env.max_turns == 4
    train, evaluation = env.get_dataset(), env.get_eval_dataset()
    assert (len(train), len(evaluation)) == (300, 40)

    def pairs(rows: Any) -> set[frozenset[str]]:
        return {frozenset(QUESTION.match(q).groups()) for q in rows["question"]}  # type: ignore[union-attr]

    assert len(pairs(train)) == 300 and not pairs(train) & pairs(evaluation)
    for row in list(train) + list(evaluation):
        a, b = QUESTION.match(row["question"]).groups()  # type: ignore[union-attr]
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and row["answer"] == str(int(a) * int(b))
        assert row["prompt"][0] == {"role": "system", "content": "Reply with the number only."}
    assert [t.name for t in env.tool_defs] == ["calculate"]


def test_tool_arith_defaults_and_a_clear_error_for_too_many_rows(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith")
    assert (len(env.get_dataset()), len(env.get_eval_dataset())) == (2000, 128)
    with pytest.raises(Exception, match="only 4095 exist"):
        vf.load_environment("tool-arith", num_train=4000, num_eval=200)


@settings(max_examples=300)
@given(
    expression=st.recursive(
        st.integers(-(10**6), 10**6).map(str) | st.floats(0.01, 1e6).map(repr),
        lambda inner: st.tuples(inner, st.sampled_from("+-*/%") | st.just("//"), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        max_leaves=8,
    )
)
def test_the_calculator_agrees_with_python(calculate: Any, expression: str) -> None:
    try:
        expected = str(eval(expression))  # trusted: built from numbers and operators above
    except ZeroDivisionError:
        with pytest.raises(ValueError, match="division by zero"):
            calculate(expression)
        return
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("__import__('os').system('true')", "Call"),
        ("(1).__class__", "Attribute"),
        ("x + 1", "Name"),
        ("2 ** 10 ** 10", "Pow"),
        ("9 ** 9", "Pow"),
        ("'7' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "List"),
        ("lambda: 1", "Lambda"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "longer than 200"),
    ],
)
def test_the_calculator_refuses_anything_but_arithmetic(
    calculate: Any, expression: str, complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        calculate(expression)


def test_a_tool_conversation_is_answered_by_the_tool_and_scored_one(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith", num_train=10, num_eval=5)
    row = env.get_dataset()[0]
    a, b = QUESTION.match(row["question"]).groups()  # type: ignore[union-attr]
    product = str(int(a) * int(b))
    client = scripted_client(
        vf,
        [{"calls": [("calculate", f'{{"expression": "{a}*{b}"}}')]}, {"content": f" {product}\n"}],
    )
    out = play(env, row, client)
    assert roles(out["completion"]) == ["assistant", "tool", "assistant"]
    assert text(out["completion"][1]) == product  # the tool's result, fed back to the model
    assert out["reward"] == 1.0 and out["metrics"]["calculate_calls"] == 1
    assert [t.name for t in client.tools[0]] == ["calculate"]


@pytest.mark.parametrize(
    ("replies", "reward"),
    [
        ([{"content": "1234"}], 0.0),  # a wrong direct answer
        ([{"calls": [("calculate", '{"expression": "os"}')]}, {"content": "os"}], 0.0),
        ([{"content": "The answer is PRODUCT"}], 0.0),  # exact match only
        ([{"content": "PRODUCT"}], 1.0),  # a right direct answer counts too
    ],
)
def test_tool_arith_scores_only_the_exact_final_answer(
    vf: ModuleType, replies: list[dict[str, Any]], reward: float
) -> None:
    env = vf.load_environment("tool-arith", num_train=10, num_eval=5)
    row = env.get_eval_dataset()[1]
    scripted = [
        {k: v.replace("PRODUCT", row["answer"]) if k == "content" else v for k, v in r.items()}
        for r in replies
    ]
    out = play(env, row, scripted_client(vf, scripted))
    assert out["reward"] == reward


def test_a_tool_error_goes_back_to_the_model_as_the_tool_turn(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith", num_train=10, num_eval=5)
    row = env.get_dataset()[2]
    client = scripted_client(
        vf, [{"calls": [("calculate", '{"expression": "import os"}')]}, {"content": "0"}]
    )
    out = play(env, row, client)
    assert "not an arithmetic expression" in text(out["completion"][1])
    assert out["reward"] == 0.0


def test_tool_arith_stops_calling_after_max_turns(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith", num_train=10, num_eval=5, max_turns=2)
    calls = [{"calls": [("calculate", '{"expression": "1+1"}')]}] * 3
    out = play(env, env.get_dataset()[0], scripted_client(vf, calls))
    assert roles(out["completion"]) == ["assistant", "tool", "assistant"]
    assert out["reward"] == 0.0 and out["stop_condition"] == "max_turns_reached"


def test_the_builtin_model_is_warmed_on_the_environments_own_prompts(vf: ModuleType) -> None:
    env = vf.load_environment("tool-arith", seed=0)
    _, held_out = builtin.split_pairs(256, seed=0)
    row = env.get_eval_dataset()[0]
    assert row["prompt"] == builtin.prompt_messages(held_out[0])
    assert env.get_eval_dataset()["question"] == [builtin.question(p) for p in held_out[:128]]
    assert env.tool_defs[0].name == builtin.TOOL_NAME
    game = vf.load_environment("guess-number", high=builtin.GUESS_HIGH).get_dataset()[0]
    assert game["prompt"] == builtin.guess_messages()


# --- guess-number --------------------------------------------------------------------------------


def test_guess_number_loads_with_secrets_from_the_seed(vf: ModuleType) -> None:
    env = vf.load_environment("guess-number", num_train=200, num_eval=20, seed=1, high=6)
    assert isinstance(env, vf.MultiTurnEnv) and env.max_turns == 4
    rows = env.get_dataset()
    assert len(rows) == 200 and len(env.get_eval_dataset()) == 20
    assert {r["info"]["secret"] for r in rows} == set(range(1, 7))
    assert rows[0]["prompt"][-1] == {"role": "user", "content": "Guess the number from 1 to 6."}
    again = vf.load_environment("guess-number", num_train=200, num_eval=20, seed=1, high=6)
    assert again.get_dataset()["answer"] == rows["answer"]
    with pytest.raises(Exception, match="high must be >= 2"):
        vf.load_environment("guess-number", high=1)


def guess_row(env: Any, secret: int) -> dict[str, Any]:
    return next(r for r in env.get_dataset() if r["info"]["secret"] == secret)


def test_hints_lead_to_the_secret_and_the_game_stops_there(vf: ModuleType) -> None:
    env = vf.load_environment("guess-number", high=8)
    client = scripted_client(vf, [{"content": "2"}, {"content": "7"}, {"content": "5"}])
    out = play(env, guess_row(env, 5), client)
    said = [(m["role"], text(m)) for m in out["completion"]]
    assert said == [
        ("assistant", "2"),
        ("user", "higher"),
        ("assistant", "7"),
        ("user", "lower"),
        ("assistant", "5"),
    ]
    assert out["reward"] == 1.0 and out["metrics"]["turns"] == 3.0
    assert out["stop_condition"] == "guessed_right"
    assert len(client.prompts) == 3


def test_a_game_not_won_within_max_turns_scores_zero(vf: ModuleType) -> None:
    env = vf.load_environment("guess-number", high=8, max_turns=3)
    client = scripted_client(
        vf, [{"content": "1"}, {"content": "seven"}, {"content": "8"}, {"content": "3"}]
    )
    out = play(env, guess_row(env, 3), client)
    hints = [text(m) for m in out["completion"] if m["role"] == "user"]
    assert hints == ["higher", "Reply with a number from 1 to 8."]
    assert out["reward"] == 0.0 and out["metrics"]["turns"] == 3.0
    assert out["stop_condition"] == "max_turns_reached"
