"""`scalerl evaluate` of a single-turn run: a sample whose reward cannot be computed counts as not
passed, in prompts x k, and is reported by reason (audit F13 for the independent path).

The demo's base model and held-out prompts; the reward is replaced by one that raises on some
answers (a reward function's own error, or the code sandbox failing). The pass rate is recounted
from the sampled completions themselves, with the same seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.generator.code_reward import SandboxFailure
from scalerl.generator.rewards import exact
from scalerl.hfeval import HeldOut, load_model, load_spec
from scalerl.status.history import REWARD_ERROR, SANDBOX

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"
PROMPTS, K = 12, 4


@pytest.fixture(scope="module")
def demo() -> tuple[HeldOut, Any]:
    from transformers import AutoTokenizer

    run = load_spec(DEMO_SPEC)
    path = run.spec.model.path
    torch.set_num_threads(1)  # many tiny matmuls: a second thread on a shared core costs more
    held = HeldOut.for_run(run, AutoTokenizer.from_pretrained(path), path, prompts=PROMPTS)
    return held, load_model(path)


def unreliable(answer: str, reference: str) -> float:
    """`exact`, except that it cannot judge an answer starting with a vowel, and the sandbox
    cannot run one that is empty."""
    if not answer:
        raise SandboxFailure("the sandbox did not start")
    if answer[0] in "aeiou":
        raise KeyError("no judge for vowels")
    return exact(answer, reference)


def test_a_reward_that_raises_counts_as_not_passed_in_prompts_times_k(demo: Any) -> None:
    held, model = demo
    held = dataclasses.replace(held, rewards={name: unreliable for name in held.rewards})
    evaluation = held.evaluate(model, K, seed=11)
    # Independently, from the same completions (same seed): what each answer is.
    completions = held.sample(model, K, seed=11)
    passes = errors = sandbox = 0
    for n, completion in enumerate(completions):
        answer = held.tokens.answer_text(completion.ids)
        reference = held.examples[n // K].answer
        if not answer:
            sandbox += 1
        elif answer[0] in "aeiou":
            errors += 1
        else:
            passes += answer == reference and not completion.truncated
    assert len(completions) == PROMPTS * K == evaluation.samples
    assert evaluation.correct == passes
    assert evaluation.pass_rate == passes / (PROMPTS * K)
    assert evaluation.unscored == errors + sandbox
    expected = {r: n for r, n in ((REWARD_ERROR, errors), (SANDBOX, sandbox)) if n}
    assert evaluation.unscored_reasons == expected
    assert [p.unscored for p in evaluation.per_prompt] == [
        sum(
            not (a := held.tokens.answer_text(c.ids)) or a[0] in "aeiou"
            for c in completions[i * K : (i + 1) * K]
        )
        for i in range(PROMPTS)
    ]
    assert errors > 0  # the demo's words: some start with a vowel
    assert f"{evaluation.unscored} unscored" in evaluation.summary()
