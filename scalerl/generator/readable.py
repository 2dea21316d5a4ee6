"""Held-out completions as a person reads them (`evaluations/` in the run directory, the
status): the prompt, the decoded completion, the answer and how it scored."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from scalerl.generator.prompts import Example
from scalerl.rollout.records import Sample

Decode = Callable[..., str]


def readable(
    examples: list[Example], groups: list[list[Sample]], wanted: int, decode: Decode
) -> list[dict[str, Any]]:
    """The first `wanted` completions of a share (`evaluation.logCompletions`), decoded, one
    per prompt in turn, so they cover as many prompts as they can."""
    pairs = [(e, g[0]) for e, g in zip(examples, groups, strict=True) if g][:wanted]
    return [
        {
            "prompt_id": example.id,
            "prompt": example.prompt,
            "completion": readable_completion(sample, decode),
            "answer": example.answer,
            "reward": sample.reward,
            "passed": sample.passed,
            "truncated": sample.truncated,
            **({"reward_error": sample.reward_error} if sample.reward_error else {}),
        }
        for example, sample in pairs
    ]


def readable_completion(sample: Sample, decode: Decode) -> str:
    """The completion's text; a conversation's whole, the environment's spans (tool results,
    its messages and their framing: not trained on) marked ⟦like this⟧."""
    if sample.conversation is None:
        return decode(sample.completion_ids)
    pairs = zip(sample.completion_ids, sample.loss_mask, strict=True)
    spans = [
        (trained, decode([t for t, _ in span], skip_special_tokens=False))
        for trained, span in itertools.groupby(pairs, key=lambda pair: pair[1] > 0)
    ]
    return "".join(text if trained else f"⟦{text}⟧" for trained, text in spans)
