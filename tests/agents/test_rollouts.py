"""Multi-turn rollouts through a real verifiers ToolEnv, the model scripted (tests/agents/scripted).

What a user checks of a tool-use run: the model's turns are trained and the tool's messages are
not, the reward is the rubric's, and a tool that raises, hangs or floods is contained with a clear
record while the rollout goes on.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import verifiers as vf
from chat_models import DROPS_THINKING, KEEPS_PREFIX, chat_tokenizer, end_id
from datasets import Dataset
from scripted import ScriptedEngine, calculator_policy, length_rules, tool_call

from scalerl.agents.client import EngineClient
from scalerl.agents.containment import contain
from scalerl.agents.load import environment_examples
from scalerl.agents.rollouts import AgentRollouts
from scalerl.generator.tokens import ModelTokens
from scalerl.rollout.records import RolloutGroup
from scalerl.spec import EnvironmentSpec, parse_run
from scalerl.trainer.batch import build_batch

pytestmark = pytest.mark.asyncio
SYSTEM = "You can use a calculator."


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: digits and + - * ( ).
    """
    if not set(expression) <= set("0123456789+-*() "):
        raise ValueError(f"not arithmetic: {expression!r}")
    return str(eval(expression))  # noqa: S307 - only digits and operators reach it


def rows(pairs: list[tuple[int, int]]) -> Dataset:
    questions = [{"question": f"What is {a}*{b}?", "answer": str(a * b)} for a, b in pairs]
    return Dataset.from_list(questions)


def exact(completion: Any, answer: str) -> float:
    said = (completion[-1].content or "").split("</think>")[-1]  # the answer after any thinking
    return 1.0 if said.strip() == answer else 0.0


def tool_env(tools: list[Any] | None = None) -> Any:
    return vf.ToolEnv(
        dataset=rows([(12, 34), (21, 3)]),
        eval_dataset=rows([(7, 8)]),
        tools=tools or [calculate],
        system_prompt=SYSTEM,
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=4,
    )


def rollouts(
    env: Any,
    policy: Any = calculator_policy,
    template: str = KEEPS_PREFIX,
    rules: Any = None,
    **spec: Any,
) -> tuple[AgentRollouts, Any]:
    """The environment's rollouts with `policy` as the model, under `rules` (`length_rules`;
    default: a model that does not think, 256 answer tokens)."""
    environment = EnvironmentSpec.model_validate({"verifiers": {"id": "inline"}, **spec})
    contain(env, environment)
    tokenizer = chat_tokenizer(template)
    length = rules or length_rules(tokenizer, end_id(tokenizer))
    engine = ScriptedEngine(tokenizer, end_id(tokenizer), policy, length)
    tokens = ModelTokens(tokenizer, frozenset({end_id(tokenizer)}), length.think_end_id)
    client = EngineClient(engine.sample_turn, tokens, length.max_model_len, length.plan)
    return AgentRollouts(env, client, environment), engine


def run_spec() -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "tools"},
            "spec": {
                "model": {"path": "/nowhere"},
                "environment": {"verifiers": {"id": "inline"}},
                "evaluation": {"everySteps": 1},
                "budget": {"maxSteps": 100},
            },
        }
    ).spec


async def test_a_tool_call_then_the_answer_is_one_sample_with_the_tool_result_masked() -> None:
    env = tool_env()
    agents, engine = rollouts(env)
    train, _ = environment_examples(env, run_spec())
    [sample] = await agents.sample(train[0], 1)
    tokenizer = agents.client.tokens.tokenizer
    prompt = agents.prompt_ids(train[0])
    assert sample.reward == 1.0 and sample.passed and not sample.truncated
    assert sample.conversation is not None
    assert (sample.conversation.turns, sample.conversation.tool_calls) == (2, 1)
    assert sample.conversation.breaks == []  # this template keeps the prefix
    # The second turn's context is exactly the prompt and everything the sample holds before it.
    second = engine.calls[1]
    assert second == prompt + sample.completion_ids[: len(second) - len(prompt)]
    # Independently: the model's spans are what the scripted model wrote, the rest is the tool's.
    first_turn = len(engine.calls[1]) - len(prompt) - sample.conversation.env_tokens
    expected = (
        [1] * first_turn
        + [0] * sample.conversation.env_tokens
        + [1] * (len(sample) - len(engine.calls[1]) + len(prompt))
    )
    assert sample.loss_mask == expected
    tool_text = tokenizer.decode(
        [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if not m]
    )
    assert tool_text == "\n<|tool|>\n408<|end|>\n<|assistant|>\n"
    assert sample.generated_tokens == sum(sample.loss_mask)


def explodes(expression: str) -> str:
    """Always fails.

    Args:
        expression: anything.
    """
    raise RuntimeError("the calculator is on fire")


def hangs(expression: str) -> str:
    """Never answers in time.

    Args:
        expression: anything.
    """
    time.sleep(5)
    return "too late"


def floods(expression: str) -> str:
    """Answers with 10 MB.

    Args:
        expression: anything.
    """
    return "9" * 10_000_000


def calls(tool: str) -> Any:
    def policy(context: str) -> str:
        if "<|tool|>" in context:
            return "done"
        return tool_call(tool, {"expression": "1"})

    return policy


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (explodes, "the calculator is on fire"),
        (hangs, "tool hangs timed out after 0.2 s"),
        (floods, "[... cut: 9999968 of 10000000 characters not shown]"),
    ],
)
async def test_a_tool_that_raises_hangs_or_floods_is_contained(tool: Any, message: str) -> None:
    env = tool_env([tool])
    agents, engine = rollouts(
        env, calls(tool.__name__), toolTimeoutSeconds=0.2, maxToolOutputChars=32
    )
    train, _ = environment_examples(env, run_spec())
    started = time.monotonic()
    [sample] = await agents.sample(train[0], 1)
    assert time.monotonic() - started < 3
    assert sample.conversation is not None and sample.conversation.turns == 2
    told = agents.client.tokens.tokenizer.decode(engine.calls[1])
    assert message in told
    assert sample.conversation.tool_errors == (0 if tool is floods else 1)
    assert len(engine.calls[1]) < 200  # the flood never reached the tokenizer whole


def thinks_then_calls(context: str) -> str:
    if "<|tool|>" in context:
        return "<think> hmm </think>" + context.rsplit("<|tool|>\n", 1)[1].split("<|end|>")[0]
    expression = context.rsplit("What is ", 1)[1].split("?", 1)[0]
    return "<think> hmm </think>" + tool_call("calculate", {"expression": expression})


@pytest.mark.parametrize("template", [KEEPS_PREFIX, DROPS_THINKING])
async def test_a_template_that_drops_past_thinking_gives_two_sequences_not_one_corrupt(
    template: str,
) -> None:
    env = tool_env()
    agents, engine = rollouts(env, thinks_then_calls, template=template)
    train, _ = environment_examples(env, run_spec())
    [sample] = await agents.sample(train[0], 1)
    prompt = agents.prompt_ids(train[0])
    assert sample.reward == 1.0 and sample.conversation is not None
    pieces = sample.pieces(prompt)
    if template == KEEPS_PREFIX:
        assert len(pieces) == 1 and sample.conversation.env_tokens > 0
        return
    # Each piece is a context the model saw and exactly the tokens it sampled from it.
    first, second = pieces
    assert sample.conversation.breaks == [(first[1].stop, engine.calls[1])]
    assert first[0] == prompt == engine.calls[0] and second[0] == engine.calls[1]
    assert all(sample.loss_mask)  # no environment tokens inside either piece
    batch, stats = build_batch(
        [RolloutGroup("p", prompt, [sample, replace(sample, reward=0.0)], 0)],
        current_version=3,
        max_off_policy=1,
        pad_id=0,
    )
    assert batch is not None and stats.samples == 2
    assert batch.samples == 4  # two rollouts, two sequences each
    advantages = batch.advantages.tolist()
    assert advantages[0] == advantages[1] > 0 > advantages[2] == advantages[3]


THINKING = "<think>" + " hmm" * 4 + "</think>"


def thinks_at_length(context: str) -> str:
    """Thinks for the same length every turn; calls the calculator twice (the product, then the
    product plus 0), then answers what it said."""
    results = context.split("<|tool|>\n")[1:]
    if len(results) == 2:
        return THINKING + results[-1].split("<|end|>")[0]
    if results:
        expression = results[-1].split("<|end|>")[0] + "+0"
    else:
        expression = context.rsplit("What is ", 1)[1].split("?", 1)[0]
    return THINKING + tool_call("calculate", {"expression": expression})


def thinking_rules(cutoff: int | None) -> Any:
    """A thinking model's rules with the cutoff fixed at `cutoff` (None: no interruption, a
    thinking budget of 20)."""
    tokenizer = chat_tokenizer()
    window = None if cutoff is None else (cutoff, cutoff)
    return length_rules(
        tokenizer, end_id(tokenizer), thinking_budget=20, window=window, thinks=True
    )


async def test_a_conversations_turns_share_one_thinking_budget_and_are_interrupted_at_it() -> None:
    tokenizer = chat_tokenizer()
    thinks = len(tokenizer.encode(THINKING, add_special_tokens=False))  # with its </think>
    cutoff = thinks + 3  # the second turn may think 3 tokens, the third none
    env = tool_env()
    agents, engine = rollouts(env, thinks_at_length, rules=thinking_rules(cutoff))
    train, _ = environment_examples(env, run_spec())
    [sample] = await agents.sample(train[0], 1)
    assert sample.conversation is not None and sample.conversation.turns == 3
    assert sample.reward == 1.0 and sample.interrupted and not sample.truncated

    # Independently, from the tokenizer: each turn's text, its thinking cut where the budget
    # ran out and the phrase (never trained) put in its place.
    phrase = agents.client.tokens.tokenizer.encode(" Time is up.</think>", add_special_tokens=False)
    prompt = agents.prompt_ids(train[0])
    contexts = [c[len(prompt) :] for c in engine.calls]
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    for k, context in enumerate(contexts):
        env_span = context[len(expected_ids) :]
        expected_ids += env_span
        expected_mask += [0] * len(env_span)
        written = tokenizer.encode(thinks_at_length(tokenizer.decode(engine.calls[k])))
        written = [*written, end_id(tokenizer)]
        answer = written[thinks:]
        thought = written[: [thinks, 3, 0][k]]
        cut = [] if k == 0 else phrase
        expected_ids += thought + cut + answer
        expected_mask += [1] * len(thought) + [0] * len(cut) + [1] * len(answer)
    assert sample.completion_ids == expected_ids
    assert sample.loss_mask == expected_mask
    said = tokenizer.decode(sample.completion_ids)
    assert said.count("Time is up.") == 2 and said.count("<think>") == 2  # none in turn 3


async def test_without_interruption_a_turn_at_the_thinking_budget_ends_the_rollout_truncated() -> (
    None
):
    env = tool_env()
    tokenizer = chat_tokenizer()
    thinks = len(tokenizer.encode(THINKING, add_special_tokens=False))
    assert thinks < 20 < 2 * thinks  # the budget lasts one turn's thinking, not two
    agents, _ = rollouts(env, thinks_at_length, rules=thinking_rules(None))
    train, _ = environment_examples(env, run_spec())
    [sample] = await agents.sample(train[0], 1)
    assert sample.conversation is not None and sample.conversation.turns == 2
    assert sample.truncated and not sample.interrupted and not sample.passed
    assert (
        sum(sample.loss_mask)
        == len(tokenizer.encode(thinks_at_length("What is 12*34?"))) + 1 + 20 - thinks
    )
