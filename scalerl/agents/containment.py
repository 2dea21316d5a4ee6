"""What an environment's tools and messages may do to a rollout, and no more.

- A tool that raises: the model reads the error as the tool's message (verifiers' own rule for
  `ToolEnv`), and the rollout counts a tool error.
- A tool that hangs or blocks: after spec.environment.toolTimeoutSeconds the model reads a
  timeout error, and nothing a tool does holds the generator's event loop (which samples every
  rollout of the generator):
  - a plain (synchronous) tool runs in a daemon thread of its own;
  - an `async def` tool runs on the environment's tool loop, an event loop of its own in a
    daemon thread (`ToolLoop`): one that awaits past the deadline is cancelled there; one that
    blocks that loop (a `time.sleep`, a synchronous HTTP call inside `async def`) gets the
    timeout all the same, and the loop it holds is given up for a fresh one, so the next calls
    are not queued behind it.
  Python cannot kill a thread, so a tool that never returns stays until the process ends, and
  (its thread being a daemon) never holds that end up.
- A tool or environment message that is huge (10 MB, or a million content parts): cut to
  spec.environment.maxToolOutputChars characters, with the cut said in the message, before
  anything tokenizes it (a tool's result is cut as it returns, before verifiers builds its
  message; the environment's messages as `env_response` returns them).
- The environment's time (its `env_response`, the tools inside it) is added up per rollout.

The environment object is changed in place (its tool table and `env_response`), never its class,
so its own code and rubric run as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from verifiers.utils.tool_utils import is_valid_tool_content_parts

from scalerl.agents.client import current
from scalerl.spec import EnvironmentSpec

# The tool loop marks its turns this often (s); when a call's deadline runs out, a loop whose
# last mark is older than half that deadline is held by a blocking tool (`ToolLoop.held`).
BEAT_S = 0.01


class ToolTimeout(Exception):
    """A tool ran past spec.environment.toolTimeoutSeconds."""


def contain(env: Any, spec: EnvironmentSpec) -> None:
    """Wrap `env`'s tools and `env_response` as the module doc says; cap its turns."""
    if hasattr(env, "call_tool"):
        env.call_tool = _counted(env.call_tool)
    tool_map = getattr(env, "tool_map", None)
    if isinstance(tool_map, dict):
        loop = ToolLoop()
        for name, tool in list(tool_map.items()):
            tool_map[name] = _guarded(
                name, tool, spec.tool_timeout_seconds, spec.max_tool_output_chars, loop
            )
    if hasattr(env, "env_response"):
        env.env_response = _timed_and_capped(env.env_response, spec.max_tool_output_chars)
    turns = getattr(env, "max_turns", None)
    if isinstance(turns, int):
        env.max_turns = spec.max_turns if turns <= 0 else min(turns, spec.max_turns)


class ToolLoop:
    """The event loop an environment's `async def` tools run on, in a daemon thread of its own,
    so that a tool which blocks holds this loop and never the generator's. One loop for all the
    environment's calls (an async client a tool keeps between calls stays on the loop it was
    made on), until a call blocks it past its deadline: that loop is given up (it stops once it
    has nothing left to run) and the next call starts a fresh one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat = 0.0  # time.monotonic() of the current loop's last mark

    async def call(self, make: Callable[[], Awaitable[Any]], timeout_s: float) -> Any:
        """`await make()` on the tool loop; TimeoutError past `timeout_s` (the call is then
        cancelled there, and a loop it blocks is given up)."""
        loop = self._current()

        async def run() -> Any:
            return await make()

        # Submitted from this task, so the tool's task sees this task's context variables.
        future = asyncio.run_coroutine_threadsafe(run(), loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            if self.held(loop, stalled_s=max(4 * BEAT_S, timeout_s / 2)):
                self._give_up(loop)
            raise

    def held(self, loop: asyncio.AbstractEventLoop, stalled_s: float) -> bool:
        """Whether `loop` (the current one) has not turned for `stalled_s`: a tool blocks it.
        (A loop merely slow to turn, taken for held, is given up for a fresh one: no harm.)"""
        with self._lock:
            return loop is self._loop and time.monotonic() - self._beat > stalled_s

    def _current(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._beat = time.monotonic()
                threading.Thread(
                    target=self._serve, args=(self._loop,), name="scalerl-tool-loop", daemon=True
                ).start()
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.create_task(self._mark(loop))
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _mark(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's heartbeat while it is the current one; once given up, it stops the loop
        when the calls still on it are done."""
        while True:
            with self._lock:
                current_loop = loop is self._loop
                if current_loop:
                    self._beat = time.monotonic()
            if not current_loop and len(asyncio.all_tasks(loop)) <= 1:
                loop.stop()
                return
            await asyncio.sleep(BEAT_S)

    def _give_up(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if loop is self._loop:
                self._loop = None


def _guarded(
    name: str, tool: Callable[..., Any], timeout_s: float, limit: int, tools: ToolLoop
) -> Callable[..., Any]:
    """`tool` with a deadline, off the generator's event loop, its result cut (module doc)."""

    @functools.wraps(tool)
    async def guarded(**kwargs: Any) -> Any:
        deadline = time.monotonic() + timeout_s
        try:
            if inspect.iscoroutinefunction(tool):
                result = await tools.call(functools.partial(tool, **kwargs), timeout_s)
            else:
                call = functools.partial(tool, **kwargs)
                result = await asyncio.wait_for(_in_thread(call), timeout_s)
                if inspect.isawaitable(result):  # a callable object whose __call__ is async
                    awaitable = result
                    left = deadline - time.monotonic()
                    result = await tools.call(lambda: awaitable, max(left, 0.0))
        except TimeoutError:
            raise ToolTimeout(f"tool {name} timed out after {timeout_s:g} s") from None
        return cut_result(result, limit)

    return guarded


def _in_thread(call: Callable[[], Any]) -> asyncio.Future[Any]:
    """`call()` in a daemon thread (with the caller's context variables); the future holds its
    result or its exception."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(call), None)
        except BaseException as err:  # handed to the awaiting rollout
            outcome = (None, err)
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool ran
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="scalerl-tool", daemon=True).start()
    return future


def _counted(call_tool: Callable[..., Any]) -> Callable[..., Any]:
    """verifiers' `call_tool` (any tool: an unknown name, bad arguments, a raise, a timeout),
    its failures counted as the rollout's tool errors."""

    @functools.wraps(call_tool)
    async def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return await call_tool(*args, **kwargs)
        except Exception:
            log = current.get(None)
            if log is not None:
                log.tool_errors += 1
            raise

    return counted


def _timed_and_capped(env_response: Callable[..., Any], limit: int) -> Callable[..., Any]:
    @functools.wraps(env_response)
    async def contained(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            messages = await env_response(*args, **kwargs)
        finally:
            log = current.get(None)
            if log is not None:
                log.env_seconds += time.perf_counter() - started
        for message in messages or []:
            _cap(message, limit)
        return messages

    return contained


def cut_result(result: Any, limit: int) -> Any:
    """A tool's result as verifiers will read it, at most `limit` characters: a text cut
    (`cut_text`), a list of content parts cut (`cut_parts`); anything else verifiers would turn
    into its text, so it is turned into it here and cut."""
    if isinstance(result, str):
        return cut_text(result, limit)
    if is_valid_tool_content_parts(result):  # verifiers' own test: kept as parts
        return cut_parts(result, limit)
    return cut_text(str(result), limit)


def cut_text(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a note of the cut (a text already cut
    so stays as it is)."""
    if len(text) <= limit or _already_cut(text, limit):
        return text
    return text[:limit] + f"\n[... cut: {len(text) - limit} of {len(text)} characters not shown]"


def cut_parts(parts: list[Any], limit: int) -> list[Any]:
    """Content parts (`{"type": "text", "text": ...}`, images, ...) cut to `limit` characters:
    a text part counts its text, any other part its size as text, every part at least one (a
    million empty parts is a flood too). The parts within the limit are kept as they are, the
    one that crosses it is cut (a text part) or left out (any other), the rest are left out, and
    a text part at the end says what was not shown."""
    if parts and _already_cut(_part_text(parts[-1]) or "", 0):
        if sum(max(1, _part_size(p)) for p in parts[:-1]) <= limit:
            return parts
    kept: list[Any] = []
    used = 0
    for k, part in enumerate(parts):
        text = _part_text(part)
        size = max(1, len(text) if text is not None else len(str(part)))
        if used + size <= limit:
            kept.append(part)
            used += size
            continue
        room = limit - used
        if text is not None and room > 0:
            kept.append({"type": "text", "text": text[:room]})
        total = used + sum(max(1, _part_size(p)) for p in parts[k:])
        note = (
            f"\n[... cut: {total - limit} of {total} characters not shown, "
            f"in {len(parts) - k} of {len(parts)} parts]"
        )
        return [*kept, {"type": "text", "text": note}]
    return parts


# The note a cut ends with (`cut_text`, `cut_parts`): the tool's result is cut as it returns,
# and the message verifiers makes of it passes the environment's cut again.
_NOTE = re.compile(r"\n\[\.\.\. cut: \d+ of \d+ characters not shown(, in \d+ of \d+ parts)?\]\Z")


def _already_cut(text: str, limit: int) -> bool:
    """Whether `text` ends with a cut's note after at most `limit` characters."""
    note = _NOTE.search(text)
    return note is not None and note.start() <= limit


def _part_text(part: Any) -> str | None:
    """A text part's text (None: another kind of part)."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    if kind != "text":
        return None
    text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
    return text if isinstance(text, str) else str(text)


def _part_size(part: Any) -> int:
    text = _part_text(part)
    return len(text) if text is not None else len(str(part))


def _cap(message: Any, limit: int) -> None:
    """Cut a message's content to `limit` characters (in place; dicts and verifiers messages;
    text or content parts)."""
    content = (
        message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    )
    if isinstance(content, str):
        cut: Any = cut_text(content, limit)
    elif isinstance(content, list):
        cut = cut_parts(content, limit)
    else:
        return
    if cut is content:
        return
    if isinstance(message, dict):
        message["content"] = cut
    else:
        message.content = cut
