"""vLLM's engine inside this process, driven from an asyncio loop: the colocated mode's engine.

`AsyncLLM` always runs its engine core in a second process, so weights handed to it cross a
process boundary (its RPC turns tensors into lists). The legacy `LLMEngine` with multiprocessing
off builds the engine core, the executor and the model here: `collective_rpc` then calls the
worker directly, and the trainer's tensors reach `reload_weights` by reference.

`InprocLLM` gives `LLMEngine` the part of `AsyncLLM`'s surface `GenerationEngine` uses (generate
as an async iterator, version labels, pause and resume, RPC), so the length rules, version stamps
and cache salts stay one code path. One stepper task calls `LLMEngine.step()` while requests are
unfinished and the engine is not paused; each step is one forward pass, run on the loop's thread
(the loop yields between steps, so scoring and commands keep up).

`Turnstile` lets another thread (the trainer) take the device between two engine steps: the
stepper never starts a step while the trainer holds it, so training and generation alternate and
each gets every core (or the whole GPU, with the engine asleep; see `Turnstile.hold`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl.errors import WeightSyncError

if TYPE_CHECKING:
    from torch import Tensor
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine


class Turnstile:
    """The device, shared by the engine's stepper (on the loop's thread) and the trainer.

    `hold()` (the trainer's thread) waits for the engine step under way to end and keeps the
    stepper from starting another until it is released. With `sleep` (GPU) the engine's memory
    is released while held (vLLM sleep mode: weights offloaded, KV cache discarded) and restored
    before the stepper runs again, so trainer and engine fit one device.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the stepper's during a step, the trainer's while held
        self._wanted = threading.Event()  # the trainer holds the device or waits for it
        self._free: asyncio.Event | None = None  # set on the loop when the trainer lets go
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine: LLMEngine | None = None
        self.sleep = False

    def attach(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop, *, sleep: bool) -> None:
        self.engine, self._loop, self.sleep = engine, loop, sleep
        self._free = asyncio.Event()

    @contextmanager
    def hold(self) -> Iterator[None]:
        self._wanted.set()
        try:
            with self._lock:
                if self.sleep and self.engine is not None:
                    self.engine.sleep(level=1, mode="keep")
                try:
                    yield
                finally:
                    if self.sleep and self.engine is not None:
                        self.engine.wake_up()
        finally:
            self._wanted.clear()
            loop, free = self._loop, self._free
            if loop is not None and free is not None and not loop.is_closed():
                loop.call_soon_threadsafe(free.set)

    async def step(self, engine: LLMEngine) -> list[RequestOutput]:
        """One engine step, once the device is free (the stepper's side)."""
        assert self._free is not None, "attach() first"
        while self._wanted.is_set():
            self._free.clear()
            if self._wanted.is_set():  # checked after clearing: a release cannot slip between
                await self._free.wait()
        with self._lock:
            return engine.step()  # type: ignore[return-value]


class InprocLLM:
    """An in-process `LLMEngine` behind the slice of `AsyncLLM`'s interface we call."""

    def __init__(self, engine: LLMEngine, turnstile: Turnstile) -> None:
        self.engine = engine
        self.turnstile = turnstile
        self._waiting: dict[str, asyncio.Future[RequestOutput]] = {}
        self._work = asyncio.Event()
        self._paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._stepper: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @classmethod
    def from_engine_args(cls, args: Any, turnstile: Turnstile, *, sleep: bool) -> InprocLLM:
        from vllm.v1.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        turnstile.attach(engine, asyncio.get_running_loop(), sleep=sleep)
        return cls(engine, turnstile)

    # --- requests --------------------------------------------------------------------------------

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """The request's final output (FINAL_ONLY requests are all we send)."""
        if self._failure is not None:
            raise RuntimeError(f"the in-process engine failed: {self._failure}")
        done = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = done
        self.engine.add_request(request_id, prompt, params)
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
                await self._resumed.wait()
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
                    done.set_exception(RuntimeError(f"the in-process engine failed: {err}"))
            self._waiting.clear()

    # --- control ---------------------------------------------------------------------------------

    async def pause(self) -> None:
        """Freeze in-flight requests with their KV cache: the stepper takes no more steps."""
        self._resumed.clear()

    async def resume_generation(self) -> None:
        self._resumed.set()

    async def update_weight_version(self, version: str) -> None:
        self.engine.set_weight_version(version)

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """The worker's method, called here: arguments pass by reference (tensors included)."""
        return self.engine.collective_rpc(method, args=args)

    def shutdown(self, timeout: float | None = None) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
        for done in self._waiting.values():
            if not done.done():
                done.cancel()
        self._waiting.clear()
        self.engine.engine_core.shutdown()


class Handoff:
    """New weights, handed from the trainer's thread to the engine's in memory.

    The trainer offers a version (its tensors, by reference), tells the generator to update, and
    waits until the engine has loaded them: until then it must not step, since the engine reads
    those very tensors. A load that failed is the trainer's error too.
    """

    def __init__(self) -> None:
        self._offer: tuple[int, list[tuple[str, Tensor]]] | None = None
        self._done = threading.Event()
        self._error: str | None = None

    def offer(self, version: int, weights: Iterable[tuple[str, Tensor]]) -> None:
        self._offer, self._error = (version, list(weights)), None
        self._done.clear()

    def wait(self, timeout_s: float) -> None:
        """The trainer's side: block until the offered version is loaded (or failed)."""
        version = self._offer[0] if self._offer is not None else None
        if not self._done.wait(timeout_s):
            raise WeightSyncError(
                f"the engine did not load version {version} within {timeout_s:g} s"
            )
        if self._error is not None:
            raise WeightSyncError(self._error)

    @contextmanager
    def receive(self, version: int) -> Iterator[list[tuple[str, Tensor]]]:
        """The engine's side: the offered tensors while it loads them."""
        offer, self._offer = self._offer, None
        try:
            if offer is None or offer[0] != version:
                offered = None if offer is None else offer[0]
                raise WeightSyncError(f"version {version} was announced but {offered} offered")
            yield offer[1]
        except BaseException as err:
            self._error = str(err) or type(err).__name__
            raise
        finally:
            self._done.set()


@dataclass
class Colocation:
    """What the trainer and the in-process engine share: the device and the weight hand-off."""

    turnstile: Turnstile = field(default_factory=Turnstile)
    handoff: Handoff = field(default_factory=Handoff)
    sleep: bool = False  # release the engine's memory while the trainer holds the device (GPU)

    def start_engine(self, engine_args: Any) -> InprocLLM:
        return InprocLLM.from_engine_args(engine_args, self.turnstile, sleep=self.sleep)
