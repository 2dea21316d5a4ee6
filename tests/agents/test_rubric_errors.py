"""A rubric that raises is seen, counted and never passes (audit F10); an agent run's held-out
pass rate is passes / (prompts x k), whatever failed (F13).

verifiers catches a raising reward function itself, logs it and scores it 0: before, the rollout
read as a model that failed, with no counter moving. The environment is a real verifiers ToolEnv,
the model scripted (tests/agents/scripted), the generator's own evaluation counts.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from test_rollouts import (
    SYSTEM,
    calculate,
    calculator_policy,
    exact,
    rollouts,
    rows,
    run_spec,
    tool_env,
)

from scalerl.agents.load import environment_examples
from scalerl.environment import ProcessEnv
from scalerl.generator.main import Generator
from scalerl.generator.prompts import PromptEncoder
from scalerl.generator.scoring import Scorer
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout.records import EvalResult, Evaluate
from scalerl.spec import parse_run
from scalerl.status.history import REWARD_ERROR, ROLLOUT_FAILED, HeldOut

N = 4


def broken(completion: Any) -> float:
    raise RuntimeError("judge unavailable")


def every_other() -> Any:
    """A reward function that raises on every second call (a flaky judge)."""
    calls = itertools.count()

    def flaky(completion: Any, answer: str) -> float:
        if next(calls) % 2:
            raise TimeoutError("judge timed out")
        return exact(completion, answer)

    return flaky


async def played(rubric: Any, n: int = N) -> Any:
    env = tool_env()
    env.rubric = rubric  # replaced after the rollouts were set up, as in the audit's S12
    agents, _ = rollouts(env)
    train, _ = environment_examples(env, run_spec())
    return await agents.play(train[0], n)


@pytest.mark.asyncio
async def test_a_reward_function_that_raises_fails_its_rollouts_with_the_reason() -> None:
    group = await played(vf.Rubric(funcs=[broken]))
    assert len(group.samples) == N and group.dropped == []  # scored as failures, not dropped
    for sample in group.samples:
        assert "broken raised RuntimeError: judge unavailable" in sample.reward_error
        assert sample.reward == 0.0 and not sample.passed


@pytest.mark.asyncio
async def test_only_the_rollouts_whose_call_raised_carry_the_error() -> None:
    group = await played(vf.Rubric(funcs=[every_other()]))
    errors = [s for s in group.samples if s.reward_error]
    assert len(errors) == N // 2
    assert all("flaky raised TimeoutError: judge timed out" in s.reward_error for s in errors)
    assert all(not s.passed for s in errors)
    # The others were judged right (the calculator policy answers 12*34 with the tool's 408).
    assert all(s.passed and s.reward == 1.0 for s in group.samples if not s.reward_error)


@pytest.mark.asyncio
async def test_a_reward_that_is_no_number_is_an_error() -> None:
    def says_yes(completion: Any) -> Any:
        return "yes"

    group = await played(vf.Rubric(funcs=[says_yes]))
    assert all("says_yes returned str 'yes', not a number" in s.reward_error for s in group.samples)


@pytest.mark.asyncio
async def test_a_group_reward_function_that_raises_fails_the_whole_group() -> None:
    def ranks(completions: list[Any]) -> list[float]:
        raise ValueError("cannot rank")

    group = await played(vf.Rubric(funcs=[exact, ranks]))
    assert len(group.samples) == N
    assert all("ranks raised ValueError: cannot rank" in s.reward_error for s in group.samples)
    assert not any(s.passed for s in group.samples)  # though exact gave each 1.0


@pytest.mark.asyncio
async def test_a_rubric_group_is_watched_in_its_parts() -> None:
    group = await played(vf.RubricGroup([vf.Rubric(funcs=[exact]), vf.Rubric(funcs=[broken])]))
    assert all("broken raised" in s.reward_error for s in group.samples)


@pytest.mark.asyncio
async def test_a_score_group_that_raises_fails_every_rollout_instead_of_dropping_the_group() -> (
    None
):
    class Down(vf.Rubric):  # type: ignore[misc]
        async def score_group(self, states: list[Any]) -> None:
            raise ConnectionError("rubric service down")

    group = await played(Down(funcs=[exact]))
    assert len(group.samples) == N and group.dropped == []
    assert all(
        s.reward_error == "the rubric raised: ConnectionError: rubric service down"
        and s.reward == 0.0
        for s in group.samples
    )


# --- an agent run's evaluation ----------------------------------------------------------------

K = 3
QUESTIONS = [(7, 8), (6, 9), (5, 5)]


def policy(context: str) -> str:
    """The calculator policy, whose engine fails on 6*9 (the rollout fails)."""
    if "What is 6*9?" in context:
        raise RuntimeError("engine lost")
    return calculator_policy(context)


def checker(completion: Any, answer: str) -> float:
    """Exact, but its service cannot judge 25."""
    if answer == "25":
        raise OSError("no route to the judge")
    return exact(completion, answer)


@dataclass
class Inbox:
    sent: list[Any] = field(default_factory=list)

    def try_send(self, message: Any) -> bool:
        self.sent.append(message)
        return True


def evaluated_env() -> Any:
    return vf.ToolEnv(
        dataset=rows([(12, 34)]),
        eval_dataset=rows(QUESTIONS),
        tools=[calculate],
        system_prompt=SYSTEM,
        rubric=vf.Rubric(funcs=[checker]),
        max_turns=4,
    )


def test_an_agent_runs_pass_rate_counts_failed_rollouts_and_rubric_errors_as_not_passed(
    tmp_path: Path,
) -> None:
    env = evaluated_env()
    agents, engine = rollouts(env, policy=policy)
    run = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "tools"},
            "spec": {
                "model": {"path": "/nowhere"},
                "environment": {"verifiers": {"id": "inline"}},
                "evaluation": {"everySteps": 1, "generationsPerPrompt": K},
                "budget": {"maxSteps": 100},
            },
        }
    )
    _, validation = environment_examples(env, run.spec)
    tokenizer = agents.client.tokens.tokenizer
    metrics = GeneratorMetrics("ns", "tools")
    generator = Generator(
        run=run,
        env=ProcessEnv(tmp_path / "run.yaml", tmp_path, "127.0.0.1", 1, 1, 0, 1, 0),
        engine=engine,  # type: ignore[arg-type]
        channel=Inbox(),  # type: ignore[arg-type]
        scorer=Scorer("exact"),
        tokens=agents.client.tokens,
        prompts=PromptEncoder(tokenizer, 64),
        train=[],
        validation=validation,
        metrics=metrics,
        agents=agents,
    )
    asyncio.run(generator.evaluate(Evaluate(step=0, version=0)))
    [result] = [m for m in generator.channel.sent if isinstance(m, EvalResult)]  # type: ignore[union-attr]
    held = HeldOut.of(result.scores)
    # Independently, from the script: 7*8 is answered right K times; 6*9's rollouts fail in the
    # engine; 25 is answered right but cannot be judged. Passes over prompts x k.
    assert [e.answer for e in validation] == ["56", "54", "25"]
    assert held.pass_rate == K / (len(QUESTIONS) * K)
    assert (held.samples, held.correct) == (9, 3)
    assert (held.unscored, held.unscored_reasons) == (6, {REWARD_ERROR: 3, ROLLOUT_FAILED: 3})
    assert [(s.correct, s.unscored) for s in result.scores] == [(3, 0), (0, 3), (0, 3)]
    assert held.fit_excluded() is not None
    assert generator.tally.environment_failures == K  # the dropped rollouts, one count each
    reward_errors = metrics.registry.get_sample_value(
        "scalerl_reward_errors_total", {"namespace": "ns", "run": "tools"}
    )
    assert reward_errors == K


def test_scalerl_evaluate_counts_an_agent_runs_rollouts_the_same_way() -> None:
    """`scalerl evaluate`'s count (scalerl.hfeval_env) of the same rollouts."""
    from scalerl.hfeval_env import count

    env = evaluated_env()
    agents, _ = rollouts(env, policy=policy)
    _, validation = environment_examples(env, run_spec())

    async def play() -> list[Any]:
        return [await agents.play(e, K, f"0/{e.id}") for e in validation]

    evaluation = count(validation, asyncio.run(play()), K, 0, 1.0, "scripted", 0.0)
    assert (evaluation.samples, evaluation.correct) == (9, 3)
    assert evaluation.pass_rate == 3 / 9
    assert (evaluation.unscored, evaluation.unscored_reasons) == (
        6,
        {REWARD_ERROR: 3, ROLLOUT_FAILED: 3},
    )
    assert [p.samples for p in evaluation.per_prompt] == [K] * 3
