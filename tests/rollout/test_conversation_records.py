"""A multi-turn rollout on the wire: its conversation's counts and breaks survive, and the
trainer reads it as the sequences the model actually saw (`Sample.pieces`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import InputError
from scalerl.rollout.records import Conversation, RolloutGroup, Sample, decode, encode


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[int], Sample]:
    """A prompt and a sample of 1-40 tokens with breaks at increasing offsets."""
    n = draw(st.integers(1, 40))
    ids = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
    mask = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    offsets = sorted(draw(st.sets(st.integers(0, n - 1), max_size=4)))
    contexts = [draw(st.lists(st.integers(0, 999), min_size=1, max_size=6)) for _ in offsets]
    conversation = Conversation(
        turns=draw(st.integers(1, 9)),
        tool_calls=draw(st.integers(0, 9)),
        tool_errors=draw(st.integers(0, 9)),
        env_seconds=draw(st.floats(0, 1e4)),
        env_tokens=n - sum(mask),
        breaks=list(zip(offsets, contexts, strict=True)),
    )
    sample = Sample(
        completion_ids=ids,
        logprobs=[-1.0] * n,
        versions=[2] * n,
        loss_mask=mask,
        reward=draw(st.floats(-1, 1)),
        truncated=draw(st.booleans()),
        interrupted=False,
        finish_reason="stop",
        pass_threshold=draw(st.floats(-1, 1)),
        conversation=conversation,
    )
    prompt = draw(st.lists(st.integers(0, 999), min_size=1, max_size=6))
    return prompt, sample


@given(conversations())
def test_a_conversation_survives_the_wire_and_its_pieces_cover_every_token_once(
    drawn: tuple[list[int], Sample],
) -> None:
    prompt, sample = drawn
    group = RolloutGroup("p", prompt, [sample], generator=0)
    [back] = decode(encode(group)).samples  # type: ignore[attr-defined]
    assert back.conversation == sample.conversation
    assert back.pass_threshold == pytest.approx(sample.pass_threshold, abs=1e-6)
    pieces = back.pieces(prompt)
    covered = [i for _, span in pieces for i in range(len(back))[span]]
    assert covered == list(range(len(back)))
    contexts = dict(sample.conversation.breaks)  # type: ignore[union-attr]
    for context, span in pieces:
        assert context == contexts.get(span.start, prompt)


def test_a_rollout_passes_at_the_environments_threshold() -> None:
    def rollout(reward: float, truncated: bool = False) -> Sample:
        return Sample([1], [0.0], [0], [1], reward, truncated, False, "stop", pass_threshold=0.5)

    assert rollout(0.5).passed and rollout(1.0).passed
    assert not rollout(0.49).passed and not rollout(1.0, truncated=True).passed


def test_breaks_out_of_order_or_past_the_end_are_refused() -> None:
    sample = Sample([1, 2], [0.0, 0.0], [0, 0], [1, 1], 1.0, False, False, "stop")
    for breaks in ([(1, [5]), (1, [6])], [(2, [5])], [(1, [5]), (0, [6])]):
        sample.conversation = Conversation(breaks=breaks)
        with pytest.raises(InputError, match="breaks"):
            sample.to_msg()
