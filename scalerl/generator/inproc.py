"""vLLM's engine inside this process, driven from an asyncio loop: the colocated mode's engine,
and a generator's on a CPU.

`AsyncLLM` always runs its engine core in a second process, so weights handed to it cross a
process boundary (its RPC turns tensors into lists). The legacy `LLMEngine` with multiprocessing
off builds the engine core, the executor and the model here: `collective_rpc` then calls the
worker directly, and the trainer's tensors reach `reload_weights` by reference.

`InprocLLM` gives `LLMEngine` the part of `AsyncLLM`'s surface `GenerationEngine` samples with
(generate as an async iterator, version labels), so the length rules, version stamps and cache
salts stay one code path. One stepper task calls `LLMEngine.step()` while requests are
unfinished; each step is one forward pass, run on the loop's thread (the loop yields between
steps, so scoring and commands keep up).

The device is shared with the trainer's thread through a `Turnstile`
(`scalerl.generator.colocation`): the stepper takes each engine step through it, so no step runs
while the trainer holds the device.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from scalerl.errors import PeerError
from scalerl.generator.colocation import Turnstile

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine

T = TypeVar("T")


class InprocLLM:
    """An in-process `LLMEngine` behind the slice of `AsyncLLM`'s interface we call."""

    def __init__(self, engine: LLMEngine, turnstile: Turnstile) -> None:
        self.engine = engine
        self.turnstile = turnstile
        self._waiting: dict[str, asyncio.Future[RequestOutput]] = {}
        self._work = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @classmethod
    def from_engine_args(cls, args: Any, turnstile: Turnstile) -> InprocLLM:
        from vllm.v1.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        turnstile.attach(engine, asyncio.get_running_loop())
        return cls(engine, turnstile)

    # --- requests --------------------------------------------------------------------------------

    async def generate(
        self, prompt: Any, params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        """The request's final output (FINAL_ONLY requests are all we send)."""
        if self._failure is not None:
            raise PeerError(f"the in-process vLLM engine failed: {self._failure}")
        done = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = done
        self.engine.add_request(request_id, prompt, params, lora_request=lora_request)
        self._work.set()
        self._ensure_stepper()
        try:
            yield await done
        finally:
            if self._waiting.pop(request_id, None) is not None:  # cancelled: free its KV
                self.engine.abort_request([request_id])

    def get_num_unfinished_requests(self) -> int:
        return self.engine.get_num_unfinished_requests()

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    def _ensure_stepper(self) -> None:
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.create_task(self._step_forever(), name="vllm-stepper")

    async def _step_forever(self) -> None:
        try:
            while True:
                if not self.engine.has_unfinished_requests():
                    self._work.clear()
                    await self._work.wait()
                    continue
                for output in await self.turnstile.step(self.engine):
                    if output.finished:
                        done = self._waiting.pop(output.request_id, None)
                        if done is not None and not done.done():
                            done.set_result(output)
                await asyncio.sleep(0)  # let scoring, the length rules and commands run
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # the engine broke: every waiting request learns why
            self._failure = err
            for done in self._waiting.values():
                if not done.done():
                    done.set_exception(PeerError(f"the in-process vLLM engine failed: {err}"))
            self._waiting.clear()

    # --- control ---------------------------------------------------------------------------------

    async def update_weight_version(self, version: str) -> None:
        self.engine.set_weight_version(version)

    async def while_held(self, call: Callable[[], T]) -> T:
        """`call()` in a thread of its own, with no engine step under way or started until it
        returns (the turnstile held): for the worker's blocking calls (joining the sync group,
        receiving a version), which would otherwise stop the event loop."""

        def held() -> T:
            with self.turnstile.hold():
                return call()

        return await asyncio.to_thread(held)

    def shutdown(self, timeout: float | None = None, *, release: bool = True) -> None:
        """Stop stepping and fail what waits; `release`: also tear the engine down (its memory
        and torch.distributed state: seconds of garbage collection, which a process about to
        exit leaves to the OS)."""
        if self._stepper is not None:
            self._stepper.cancel()
        for done in self._waiting.values():
            if not done.done():
                done.cancel()
        self._waiting.clear()
        if release:
            self.engine.engine_core.shutdown()
