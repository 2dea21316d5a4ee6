"""The length rules against their definition, on a policy that needs no engine.

The policy is deterministic: the token at each completion position is fixed by the test (what
vLLM would sample there). Whatever requests `LengthControl` makes, a sample must then be exactly
what the plain two-request definition gives (think until `</think>`, EOS or the cutoff; then answer
within the answer budget): the same tokens, log-probs, versions, mask and flags. Going on past
`</think>` in the first request is an optimisation and may change nothing but the request count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.generator.length import Allowance, LengthControl, Segment, _Completion
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import Sample

THINK_END, EOS, PHRASE = 7, 2, (40, 41, 7)
PROMPT = [1, 30, 31]


class Policy:
    """Completion position -> token; log-prob -position and version 3 mark each token's origin.
    Counts requests and the tokens they sampled."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.requests = 0
        self.sampled = 0

    async def __call__(self, prompt: list[int], max_tokens: int, stop: Sequence[int]) -> Segment:
        self.requests += 1
        at = len(prompt) - len(PROMPT)  # where in the completion this request starts
        ids: list[int] = []
        reason = "length"
        while len(ids) < max_tokens:
            token = self.tokens[(at + len(ids)) % len(self.tokens)]
            ids.append(token)
            if token in stop:
                reason = "stop"
                break
        self.sampled += len(ids)
        positions = range(at, at + len(ids))
        return Segment(ids, [-float(p) for p in positions], [3] * len(ids), reason)


async def reference(control: LengthControl, policy: Policy, cutoff: int, version: int) -> Sample:
    """The two-request definition: think (stopping at </think> or EOS), then answer."""
    out = _Completion()
    room = min(cutoff, control.max_model_len - len(PROMPT))
    thinking = await policy(PROMPT, room, [THINK_END, EOS])
    out.add(thinking)
    closed = bool(thinking.token_ids) and thinking.token_ids[-1] == THINK_END
    if thinking.finish_reason == "stop" and not closed:
        return out.finish("stop", truncated=False, interrupted=False)
    interrupted = False
    if not closed:
        if not (control.plan.enabled and len(thinking.token_ids) >= cutoff):
            return out.finish("length", truncated=True, interrupted=False)
        out.inject(PHRASE, version)
        interrupted = True
    room = min(control.plan.answer_budget, control.max_model_len - len(PROMPT) - len(out.ids))
    if room <= 0:
        return out.finish("length", truncated=True, interrupted=interrupted)
    answer = await policy(PROMPT + out.ids, room, [EOS])
    out.add(answer)
    truncated = answer.finish_reason == "length"
    return out.finish(answer.finish_reason, truncated=truncated, interrupted=interrupted)


tokens = st.lists(st.sampled_from([THINK_END, EOS, 50, 51, 52, 53, 54]), min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(
    stream=tokens,
    cutoff=st.integers(1, 20),
    answer_budget=st.integers(1, 20),
    spare=st.integers(0, 50),
    enabled=st.booleans(),
)
def test_samples_are_the_two_request_definitions(
    stream: list[int], cutoff: int, answer_budget: int, spare: int, enabled: bool
) -> None:
    plan = InterruptionPlan(
        thinking_budget=cutoff,
        answer_budget=answer_budget,
        window=(cutoff, cutoff),
        enabled=enabled,
    )
    max_model_len = len(PROMPT) + 1 + spare  # sometimes shorter than the budgets
    control = LengthControl(plan, THINK_END, PHRASE, max_model_len, (EOS,))
    ours, theirs = Policy(stream), Policy(stream)
    got = asyncio.run(control.sample(ours, PROMPT, cutoff, lambda: 5))
    want = asyncio.run(reference(control, theirs, cutoff, 5))
    assert got == want
    assert ours.requests <= theirs.requests
    # Tokens sampled and then dropped: only past the answer budget of a truncated answer.
    assert ours.sampled - theirs.sampled <= max(0, cutoff - answer_budget)


def test_an_answer_that_ends_within_the_cutoff_takes_one_request() -> None:
    plan = InterruptionPlan(thinking_budget=16, answer_budget=16, window=(12, 16))
    control = LengthControl(plan, THINK_END, PHRASE, 100, (EOS,))
    policy = Policy([50, 51, THINK_END, 52, 53, EOS])
    sample = asyncio.run(control.sample(policy, PROMPT, 12, lambda: 0))
    assert sample.completion_ids == [50, 51, THINK_END, 52, 53, EOS]
    assert (sample.finish_reason, sample.truncated, sample.interrupted) == ("stop", False, False)
    assert policy.requests == 1


@given(
    head=st.lists(st.booleans(), max_size=12),
    tail=st.lists(st.booleans(), max_size=12),
    closes=st.booleans(),
    by_model=st.booleans(),
)
def test_a_turn_spends_its_sampled_thinking_then_answer_tokens(
    head: list[bool], tail: list[bool], closes: bool, by_model: bool
) -> None:
    """Thinking is what the policy sampled up to the first `</think>` (its own, trained, or an
    injected phrase's, not); the rest it sampled is answer; injected tokens spend nothing."""
    think_end, other = 9, 5
    ids = [other] * len(head) + ([think_end] if closes else []) + [other] * len(tail)
    closing = [int(by_model)] if closes else []
    mask = [int(b) for b in head] + closing + [int(b) for b in tail]
    sample = Sample(ids, [0.0] * len(ids), [0] * len(ids), mask, 0.0, False, False, "stop")
    thinking = sum(head) + sum(closing) if closes else sum(mask)
    left = Allowance(thinking=100, answer=100).after(sample, think_end)
    assert (100 - left.thinking, 100 - left.answer) == (thinking, sum(mask) - thinking)
    plain = Allowance(thinking=100, answer=100).after(sample, None)
    assert (plain.thinking, 100 - plain.answer) == (100, sum(mask))
