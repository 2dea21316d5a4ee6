"""Every rollout message survives encode/decode; malformed input is refused with InputError."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import InputError
from scalerl.rollout import (
    EvalResult,
    Evaluate,
    Failure,
    GeneratorStats,
    Hello,
    Message,
    MoreRollouts,
    RolloutGroup,
    Sample,
    Start,
    Stop,
    UpdateWeights,
    decode,
    encode,
)
from scalerl.rollout.records import MESSAGE_TYPES, Ping, Ready, Regroup
from scalerl.status.history import PromptScore


def sample(reward: float = 1.0, versions: tuple[int, ...] = (3, 3, 4)) -> Sample:
    n = len(versions)
    return Sample(
        completion_ids=[5, 70000, 2**31 + 1][:n] + [1] * max(n - 3, 0),
        logprobs=[-0.5, -1.25, -0.0][:n] + [-2.0] * max(n - 3, 0),
        versions=list(versions),
        loss_mask=[1, 0, 1][:n] + [1] * max(n - 3, 0),
        reward=reward,
        truncated=False,
        interrupted=True,
        finish_reason="stop",
    )


EXAMPLES: list[Message] = [
    RolloutGroup("gsm8k/17", [1, 2, 3], [sample(1.0), sample(0.0, (2, 5, 5))], generator=3),
    RolloutGroup("empty", [], [], generator=0),
    EvalResult(
        step=100,
        version=99,
        generator=1,
        scores=[PromptScore("val/3", 8, 5, 1), PromptScore("val/9", 8, 0, 0)],
        tokens=12345,
        completions=[{"prompt_id": "val/3", "completion": "cba", "reward": 1.0, "passed": True}],
    ),
    EvalResult(step=0, version=0, generator=0, scores=[], tokens=0),
    GeneratorStats(
        generator=2,
        version=7,
        generated_tokens=10**12,
        generated_sequences=9,
        truncated_sequences=1,
        idle_seconds=0.25,
        weight_sync_seconds=1.5,
        uptime_seconds=60.0,
        score_seconds=0.5,
        send_wait_seconds=2.0,
    ),
    Hello(generator=4, pid=1234),
    Failure(generator=4, message="weights of version 8: checksum mismatch"),
    Start(
        version=8, step=7, curriculum={"threshold": 0.9, "dropped": ["a", "b"], "seen": {"a": 3}}
    ),
    Start(version=0, step=0),
    Start(version=9, step=9, consumed={"p": [0, 1]}, generation=3, members=[0, 2]),
    Ready(generator=1),
    Regroup(generation=4, members=[0, 1, 2]),
    Ping(),
    UpdateWeights(version=8),
    MoreRollouts(version=8),
    Evaluate(step=200, version=8),
    Stop(reason="budget reached: maxSteps"),
]


def test_examples_cover_every_message_type() -> None:
    assert {type(m).TYPE for m in EXAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_survives_encode_and_decode(msg: Message) -> None:
    data = encode(msg)
    assert isinstance(data, bytes)
    again = decode(data)
    assert type(again) is type(msg) and again == msg


def test_logprobs_travel_as_float32() -> None:
    group = RolloutGroup("p", [1], [sample()], 0)
    group.samples[0].logprobs = [-0.1, -1e-9, -30.123456789]
    got = decode(encode(group))
    assert isinstance(got, RolloutGroup)
    assert got.samples[0].logprobs == np.asarray([-0.1, -1e-9, -30.123456789], "<f4").tolist()


def test_versions_and_loss_mask_are_run_length_encoded() -> None:
    long = Sample(
        list(range(6000)),
        [-1.0] * 6000,
        [3] * 4000 + [4] * 2000,
        [1] * 5000 + [0] * 1000,
        1.0,
        False,
        False,
        "length",
    )
    msg = long.to_msg()
    assert msg["versions"] == [3, 4000, 4, 2000] and msg["loss_mask"] == [1, 5000, 0, 1000]
    size = len(encode(RolloutGroup("p", [1], [long], 0)))
    assert size < 6000 * (3 + 4) + 300  # ids (<= 3 bytes each) + float32 log-probs + a little


def test_group_versions_and_pass_rate() -> None:
    group = RolloutGroup("p", [1], [sample(1.0, (3, 3, 4)), sample(0.0, (2, 6)), sample(0.5)], 1)
    assert (group.min_version, group.max_version) == (2, 6)
    assert group.pass_rate == pytest.approx(2 / 3)
    assert group.completion_tokens == 8
    with pytest.raises(InputError, match="no generated tokens"):
        _ = RolloutGroup("p", [1], [], 1).min_version


def test_a_truncated_sample_fails_whatever_its_reward() -> None:
    """One definition of a pass for the train batch, the held-out scores and the curriculum."""
    cut = sample(1.0)
    cut.truncated = True
    assert sample(1.0).passed and not sample(0.0).passed and not cut.passed
    assert RolloutGroup("p", [1], [sample(1.0), cut], 0).pass_rate == 0.5


scores = st.lists(
    st.tuples(
        st.text(max_size=8),
        st.integers(0, 64),
        st.integers(0, 64),
        st.integers(0, 64),
        st.sampled_from(["", "math", "code"]),
    ).map(lambda t: PromptScore(t[0], max(t[1:4]), t[2], t[3], t[4])),
    max_size=20,
)


@given(scores)
def test_evaluation_scores_survive_the_wire(rows: list[PromptScore]) -> None:
    msg = EvalResult(step=3, version=3, generator=0, scores=rows, tokens=7)
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize(
    "row",
    [
        ["p", 4, 5, 0, "math"],
        ["p", 4, 1, 5, "math"],
        ["p", -1, 0, 0, "math"],
        [3, 4, 1, 0, "math"],
        ["p", 4, 1, 0, 7],  # a domain that is not a name
        ["p", 4, 1, 0],  # no domain
        ["p", 4, 1],
    ],
)
def test_impossible_evaluation_scores_are_refused(row: list[object]) -> None:
    raw = EvalResult(step=1, version=1, generator=0, scores=[], tokens=0).to_msg()
    raw["scores"] = [row]
    with pytest.raises(InputError, match="eval_result.scores"):
        decode(msgpack.packb(raw))


def test_start_refuses_a_curriculum_that_is_not_a_map() -> None:
    with pytest.raises(InputError, match="start.curriculum"):
        decode(msgpack.packb({"type": "start", "version": 1, "step": 1, "curriculum": [1]}))


def test_unknown_message_type_is_rejected() -> None:
    with pytest.raises(InputError, match="unknown message type 'launch_missiles'"):
        decode(msgpack.packb({"type": "launch_missiles", "generator": 1}))


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1garbage",
        msgpack.packb([1, 2]),
        msgpack.packb({"generator": 1}),
        msgpack.packb({"type": "hello", "generator": 1}),
        msgpack.packb({"type": "hello", "generator": "one", "pid": 3}),
        msgpack.packb({"type": "hello", "generator": True, "pid": 3}),
        msgpack.packb({"type": "stop", "reason": None}),
    ],
    ids=[
        "not-msgpack",
        "not-a-map",
        "no-type",
        "missing-field",
        "str-for-int",
        "bool-for-int",
        "none-for-str",
    ],
)
def test_malformed_messages_are_rejected(data: bytes) -> None:
    with pytest.raises(InputError):
        decode(data)


def test_inconsistent_sample_is_refused_on_both_ends() -> None:
    bad = sample()
    bad.versions = [1]
    with pytest.raises(InputError, match="3 tokens but 3 logprobs, 1 versions"):
        encode(RolloutGroup("p", [1], [bad], 0))
    raw = RolloutGroup("p", [1], [sample()], 0).to_msg()
    raw["samples"][0]["versions"] = [3, 2]
    with pytest.raises(InputError, match="3 tokens"):
        decode(msgpack.packb(raw))
