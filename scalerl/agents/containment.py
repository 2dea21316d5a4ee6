"""What an environment's tools and messages may do to a rollout, and no more.

- A tool that raises: the model reads the error as the tool's message (verifiers' own rule for
  `ToolEnv`), and the rollout counts a tool error.
- A tool that hangs: after spec.environment.toolTimeoutSeconds the model reads a timeout error.
  A plain (synchronous) tool runs in a daemon thread of its own so it cannot stall the
  generator's event loop; Python cannot kill a thread, so one that never returns stays until the
  process ends, and (being a daemon) never holds that end up.
- A tool or environment message that is huge (10 MB): cut to spec.environment.maxToolOutputChars
  characters, with the cut said in the message, before anything tokenizes it.
- The environment's time (its `env_response`, the tools inside it) is added up per rollout.

The environment object is changed in place (its tool table and `env_response`), never its class,
so its own code and rubric run as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from scalerl.agents.client import current
from scalerl.spec import EnvironmentSpec


class ToolTimeout(Exception):
    """A tool ran past spec.environment.toolTimeoutSeconds."""


def contain(env: Any, spec: EnvironmentSpec) -> None:
    """Wrap `env`'s tools and `env_response` as the module doc says; cap its turns."""
    if hasattr(env, "call_tool"):
        env.call_tool = _counted(env.call_tool)
    tool_map = getattr(env, "tool_map", None)
    if isinstance(tool_map, dict):
        for name, tool in list(tool_map.items()):
            tool_map[name] = _guarded(name, tool, spec.tool_timeout_seconds)
    if hasattr(env, "env_response"):
        env.env_response = _timed_and_capped(env.env_response, spec.max_tool_output_chars)
    turns = getattr(env, "max_turns", None)
    if isinstance(turns, int):
        env.max_turns = spec.max_turns if turns <= 0 else min(turns, spec.max_turns)


def _guarded(name: str, tool: Callable[..., Any], timeout_s: float) -> Callable[..., Any]:
    """`tool` with a deadline, off the event loop (module doc)."""

    @functools.wraps(tool)
    async def guarded(**kwargs: Any) -> Any:
        try:
            if inspect.iscoroutinefunction(tool):
                return await asyncio.wait_for(tool(**kwargs), timeout_s)
            return await asyncio.wait_for(_in_thread(functools.partial(tool, **kwargs)), timeout_s)
        except TimeoutError:
            raise ToolTimeout(f"tool {name} timed out after {timeout_s:g} s") from None

    return guarded


def _in_thread(call: Callable[[], Any]) -> asyncio.Future[Any]:
    """`call()` in a daemon thread; the future holds its result or its exception."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (call(), None)
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


def _cap(message: Any, limit: int) -> None:
    """Cut a message's text to `limit` characters (in place; dicts and verifiers messages)."""
    content = (
        message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    )
    if not isinstance(content, str) or len(content) <= limit:
        return
    note = f"\n[... cut: {len(content) - limit} of {len(content)} characters not shown]"
    cut = content[:limit] + note
    if isinstance(message, dict):
        message["content"] = cut
    else:
        message.content = cut
