"""What an environment's tools may do to a rollout (scalerl.agents.containment), through a real
verifiers ToolEnv with the model scripted (tests/agents/test_rollouts' helpers).

A tool, plain or `async def`, that blocks or never answers gets its timeout within
toolTimeoutSeconds, and the generator's event loop (which samples every rollout) keeps turning
meanwhile; a tool whose result floods as content parts is cut as a text flood is.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted import tool_call
from test_rollouts import calls, rollouts, run_spec, tool_env

from scalerl.agents.containment import cut_parts, cut_result
from scalerl.agents.load import environment_examples

TIMEOUT_S = 0.2
CANCELLED: list[str] = []  # what awaits_forever was called with, once cancelled


async def blocks_async(expression: str) -> str:
    """Blocks its event loop for 4 s (synchronous work inside async def).

    Args:
        expression: anything.
    """
    time.sleep(4)
    return "late"


async def awaits_forever(expression: str) -> str:
    """Waits for an answer that never comes.

    Args:
        expression: anything.
    """
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CANCELLED.append(expression)
        raise
    return "never"


async def adds_async(expression: str) -> str:
    """Adds, as an async tool.

    Args:
        expression: a sum of digits.
    """
    await asyncio.sleep(0)
    return str(sum(int(t) for t in expression.split("+")))


def floods_one_part(expression: str) -> list[dict[str, str]]:
    """10 MB as one content part.

    Args:
        expression: anything.
    """
    return [{"type": "text", "text": "9" * 10_000_000}]


def floods_many_parts(expression: str) -> list[dict[str, str]]:
    """200,000 content parts of 50 characters.

    Args:
        expression: anything.
    """
    return [{"type": "text", "text": "9" * 50} for _ in range(200_000)]


async def _ticking(gaps: list[float], stop: asyncio.Event) -> None:
    """The generator's loop at work: the longest wait between its turns goes into `gaps`."""
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


async def _one_rollout(env: Any, policy: Any, **spec: Any) -> tuple[Any, str, float, float]:
    """(sample, the model's last context as text, seconds, the loop's longest pause)."""
    agents, engine = rollouts(env, policy, **spec)
    train, _ = environment_examples(env, run_spec())
    gaps: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticking(gaps, stop))
    started = time.monotonic()
    [sample] = await agents.sample(train[0], 1)
    seconds = time.monotonic() - started
    stop.set()
    await ticker
    told = agents.client.tokens.tokenizer.decode(engine.calls[-1])
    return sample, told, seconds, max(gaps)


@pytest.mark.asyncio
@pytest.mark.parametrize("tool", [blocks_async, awaits_forever])
async def test_an_async_tool_that_blocks_or_never_answers_times_out_and_frees_the_loop(
    tool: Any,
) -> None:
    CANCELLED.clear()
    env = tool_env([tool])
    sample, told, seconds, pause = await _one_rollout(
        env, calls(tool.__name__), toolTimeoutSeconds=TIMEOUT_S
    )
    assert f"tool {tool.__name__} timed out after {TIMEOUT_S:g} s" in told
    assert sample.conversation is not None and sample.conversation.tool_errors == 1
    assert seconds < 2.5  # the 4 s tool is not waited for
    assert pause < 1.0  # the generator's loop kept turning while the tool ran
    if tool is awaits_forever:
        for _ in range(100):  # the cancellation reaches the tool's own loop
            if CANCELLED:
                break
            await asyncio.sleep(0.01)
        assert CANCELLED == ["1"]


def blocks_then_adds(context: str) -> str:
    results = context.count("<|tool|>")
    if results == 0:
        return tool_call("blocks_async", {"expression": "1"})
    if results == 1:
        return tool_call("adds_async", {"expression": "2+3"})
    return "done"


@pytest.mark.asyncio
async def test_after_an_async_tool_blocked_the_next_async_call_answers_at_once() -> None:
    env = tool_env([blocks_async, adds_async])
    sample, told, seconds, _ = await _one_rollout(
        env, blocks_then_adds, toolTimeoutSeconds=TIMEOUT_S
    )
    assert "tool blocks_async timed out" in told
    assert told.rstrip().endswith("<|tool|>\n5<|end|>\n<|assistant|>")  # the second tool's
    assert sample.conversation is not None and sample.conversation.tool_errors == 1
    assert seconds < 2.5  # not queued behind the blocked loop (4 s)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("tool", "note"),
    [
        (floods_one_part, "[... cut: 9999968 of 10000000 characters not shown, in 1 of 1 parts]"),
        (
            floods_many_parts,
            "[... cut: 9999968 of 10000000 characters not shown, in 200000 of 200000 parts]",
        ),
    ],
)
async def test_a_tool_that_floods_as_content_parts_is_cut_as_text_is(tool: Any, note: str) -> None:
    env = tool_env([tool])
    sample, told, seconds, _ = await _one_rollout(env, calls(tool.__name__), maxToolOutputChars=32)
    assert "<|tool|>\n" + "9" * 32 + "\n" + note + "<|end|>" in told
    assert sample.conversation is not None and sample.conversation.tool_errors == 0
    assert len(told) < 1000 and seconds < 5  # the flood never reached the tokenizer whole


def _size(part: dict[str, Any]) -> int:
    """A part's characters as the cut counts them, computed here from the part's fields."""
    if part["type"] == "text":
        return max(1, len(part["text"]))
    return max(1, len(str(part)))


PARTS = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=40)),
        st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, st.text(max_size=40)),
    ),
    max_size=30,
)


@given(PARTS, st.integers(min_value=1, max_value=400))
def test_content_parts_are_cut_to_the_limit_in_order_with_the_cut_said(
    parts: list[dict[str, Any]], limit: int
) -> None:
    total = sum(_size(p) for p in parts)
    out = cut_parts(parts, limit)
    if total <= limit:
        assert out is parts
        return
    *shown, note = out
    assert note["type"] == "text"
    match = re.fullmatch(
        r"\n\[\.\.\. cut: (\d+) of (\d+) characters not shown, in (\d+) of (\d+) parts\]",
        note["text"],
    )
    assert match is not None
    assert [int(g) for g in match.groups()] == [
        total - limit,
        total,
        len(parts) - len([a for a, b in zip(shown, parts, strict=False) if a is b]),
        len(parts),
    ]
    whole = [a for a, b in zip(shown, parts, strict=False) if a is b]
    assert whole == parts[: len(whole)]  # the parts kept whole are the first ones, unchanged
    rest = shown[len(whole) :]
    assert len(rest) <= 1
    if rest:  # the text part that crossed the limit, cut to what was left of it
        crossing = parts[len(whole)]
        assert crossing["type"] == "text"
        assert crossing["text"].startswith(rest[0]["text"])
        assert sum(_size(p) for p in whole) + len(rest[0]["text"]) == limit
    assert sum(_size(p) for p in shown) <= limit


def test_a_tool_result_verifiers_would_turn_into_text_is_cut_as_text() -> None:
    assert cut_result({"n": "9" * 100}, 20) == (
        "{'n': '" + "9" * 13 + "\n[... cut: 89 of 109 characters not shown]"
    )
    assert cut_result("short", 20) == "short"
    assert cut_result([{"type": "text", "text": "ok"}], 20) == [{"type": "text", "text": "ok"}]
