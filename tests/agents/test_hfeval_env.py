"""`scalerl.hfeval` on a run with spec.environment: the held-out prompts played as multi-turn
rollouts through verifiers' loop, each model turn sampled by Hugging Face `generate`.

The evaluator's pass rate is checked against an independent reading of the conversations it
recorded: the token ids decoded, split into turns by the chat format, each calculator result
recomputed with Python, and the final answer compared with the product of the question's operands.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from scalerl.agents.rollouts import first_context
from scalerl.cli import main
from scalerl.hfeval import held_out, load_model, load_spec
from scalerl.hfeval_env import AgentHeldOut
from scalerl.rollout.records import Sample
from scalerl.runfile import write_variant

ROOT = Path(__file__).resolve().parents[2]
TOOL_SPEC = ROOT / "examples" / "tool-env.yaml"
QUESTION = re.compile(r"What is (\d+)\*(\d+)\?")
END, ASSISTANT, TOOL = "<|end|>\n", "<|assistant|>\n", "<|tool|>\n"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>")
PROMPTS, K = 8, 4


@pytest.fixture(scope="module")
def tool_run(environment_packages: list[str]) -> Any:
    return load_spec(TOOL_SPEC)


@pytest.fixture(scope="module")
def held(tool_run: Any) -> AgentHeldOut:
    path = tool_run.spec.model.path
    evaluation = held_out(tool_run, AutoTokenizer.from_pretrained(path), path, PROMPTS)
    assert isinstance(evaluation, AgentHeldOut)
    return evaluation


@pytest.fixture(scope="module")
def model(tool_run: Any) -> Any:
    return load_model(tool_run.spec.model.path)


def turns(text: str) -> list[tuple[str, str]]:
    """(role, text) of each turn after the prompt: the completion starts inside an assistant
    turn; every turn ends with <|end|>."""
    out, role = [], "assistant"
    for chunk in text.split(END):
        if not chunk:
            continue
        for head, name in ((ASSISTANT, "assistant"), (TOOL, "tool")):
            if chunk.startswith(head):
                role, chunk = name, chunk[len(head) :]
        out.append((role, chunk.removesuffix("<|end|>")))
    return out


def independent_pass(sample: Sample, question: str, tokenizer: Any, budget: int) -> bool:
    """Whether the conversation answers `question` right, read from its tokens alone; each
    calculator result in it is checked against Python's arithmetic on the way."""
    a, b = map(int, QUESTION.fullmatch(question).groups())  # type: ignore[union-attr]
    conversation = turns(tokenizer.decode(sample.completion_ids))
    for (role, text), after in zip(conversation, conversation[1:] + [("", "")], strict=True):
        for call in CALL.findall(text) if role == "assistant" else []:
            expression = json.loads(call)["arguments"]["expression"]
            if re.fullmatch(r"\d+\*\d+", expression) and after[0] == "tool":
                x, y = map(int, expression.split("*"))
                assert after[1] == str(x * y), (expression, after)
    model_tokens = sum(sample.loss_mask)
    finished = sample.completion_ids[-1] in tokenizer.convert_tokens_to_ids(["<|end|>"])
    role, final = conversation[-1]
    return (
        role == "assistant"
        and "<tool_call>" not in final
        and final.strip() == str(a * b)
        and finished
        and model_tokens <= budget
    )


@pytest.mark.slow  # 32 multi-turn conversations sampled token by token with HF generate
def test_the_pass_rate_is_what_the_conversations_show(
    held: AgentHeldOut, model: Any, tool_run: Any
) -> None:
    tokenizer = held.tokens.tokenizer
    groups = held.rollouts(model, K, seed=7)
    budget = tool_run.spec.recipe.length.answer_budget
    verdicts = [
        [independent_pass(s, e.prompt, tokenizer, budget) for s in group]
        for e, group in zip(held.examples, groups, strict=True)
    ]
    assert [[s.passed for s in g] for g in groups] == verdicts
    evaluation = held.evaluate(model, K, seed=7)
    passes = sum(map(sum, verdicts))
    rollouts = sum(map(len, verdicts))
    assert rollouts == PROMPTS * K == evaluation.samples  # the environment dropped none
    assert evaluation.correct == passes
    assert evaluation.pass_rate == passes / rollouts
    # The model both answers directly and calls the tool; the tool path passes.
    called = [s for g in groups for s in g if "<tool_call>" in tokenizer.decode(s.completion_ids)]
    assert 0 < len(called) < rollouts
    assert 0 < passes < rollouts


def test_the_same_seed_gives_the_same_evaluation(held: AgentHeldOut, model: Any) -> None:
    few = dataclasses.replace(held, examples=held.examples[:3])
    first, again = few.evaluate(model, 2, seed=3), few.evaluate(model, 2, seed=3)
    assert first.per_prompt == again.per_prompt

    def conversations(seed: int) -> list[list[list[int]]]:
        return [[s.completion_ids for s in g] for g in few.rollouts(model, 2, seed=seed)]

    assert conversations(3) != conversations(4)  # another seed, other samples
    assert model.training is False  # load_model's mode, left as it was


def test_scalerl_evaluate_reads_an_agent_run(
    tool_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_variant(
        TOOL_SPEC, tmp_path / "tool.yaml", {"data": {"validation": {"prompts": 4}}}
    )
    code = main(["evaluate", "builtin:tool-arith", "--spec", str(spec), "-k", "2", "--json"])
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompts"] == 4 and record["samples"] == 8
    assert 0 <= record["correct"] <= 8


def test_a_thinking_run_keeps_the_length_rules_over_its_turns(tool_run: Any, model: Any) -> None:
    """With `<tool_call>` read as the end of thinking (the model writes it first when it calls
    the tool), a 2-4 token cutoff and interruption: each rollout thinks at most its cutoff, the
    phrase (not trained on) marks exactly the interrupted ones."""
    data = tool_run.model_dump(by_alias=True, mode="json")
    data["spec"]["model"]["thinkEnd"] = "<tool_call>"
    data["spec"]["recipe"]["length"] = {
        "thinkingBudget": 4,
        "answerBudget": 48,
        "interruption": {"enabled": True, "window": [2, 4]},
    }
    thinking = type(tool_run).model_validate(data)
    path = thinking.spec.model.path
    evaluation = AgentHeldOut.for_run(thinking, AutoTokenizer.from_pretrained(path), path, 4)
    phrase = list(evaluation.length.phrase_ids)
    think_end = evaluation.tokens.think_end_id
    samples = [s for g in evaluation.rollouts(model, 4, seed=5) for s in g]
    assert len(samples) == 16
    for sample in samples:
        ids, mask = sample.completion_ids, sample.loss_mask
        at = next(i for i in range(len(ids) + 1) if i == len(ids) or ids[i] == think_end)
        assert sum(mask[:at]) <= 4  # thought at most the cutoff
        injected = [
            i for i in range(len(ids) - len(phrase) + 1) if ids[i : i + len(phrase)] == phrase
        ]
        assert sample.interrupted == bool(injected)
        for i in injected:
            assert mask[i : i + len(phrase)] == [0] * len(phrase)
        assert sum(mask) <= 4 + 48
    assert 0 < sum(s.interrupted for s in samples) < len(samples)


def test_a_turn_stops_where_the_models_context_ends(held: AgentHeldOut, model: Any) -> None:
    lengths = [len(first_context(held.env, held.tokens.tokenizer, e)) for e in held.examples]
    longest = max(lengths)
    examples = tuple(e for e, n in zip(held.examples, lengths, strict=True) if n == longest)
    room = 3  # fewer tokens than any answer and its <|end|>
    length = dataclasses.replace(held.length, max_model_len=longest + room)
    short = dataclasses.replace(held, examples=examples, length=length)
    for group in short.rollouts(model, 2, seed=1):
        assert len(group) == 2
        for sample in group:
            assert len(sample.completion_ids) == room  # one turn, cut by the context
            assert sample.truncated and not sample.passed
