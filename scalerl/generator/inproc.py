"""vLLM's engine inside this process, driven from an asyncio loop: the colocated mode's engine.

`AsyncLLM` always runs its engine core in a second process, so weights handed to it cross a
process boundary (its RPC turns tensors into lists). The legacy `LLMEngine` with multiprocessing
off builds the engine core, the executor and the model here: `collective_rpc` then calls the
worker directly, and the trainer's tensors reach `reload_weights` by reference.

`InprocLLM` gives `LLMEngine` the part of `AsyncLLM`'s surface `GenerationEngine` samples with
(generate as an async iterator, version labels), so the length rules, version stamps and cache
salts stay one code path. One stepper task calls `LLMEngine.step()` while requests are
unfinished; each step is one forward pass, run on the loop's thread (the loop yields between
steps, so scoring and commands keep up).

`Turnstile` lets another thread (the trainer) take the device between two engine steps: the
stepper never starts a step while the trainer holds it. On a GPU training and generation take
turns this way (with the engine asleep while the trainer steps; see `Turnstile.hold`); on a CPU
they share the cores (`Colocation.exclusive`). The trainer loads new weights while it holds the
device (`Colocation.load`): in-flight requests are frozen with their KV cache, as by a pause, and
continue on the new weights.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl.errors import PeerError, WeightSyncError

if TYPE_CHECKING:
    from torch import Tensor
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine

    from scalerl.generator.engine import GenerationEngine


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

    def attach(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self._loop = engine, loop
        self._free = asyncio.Event()

    @contextmanager
    def hold(self, *, sleep: bool = False) -> Iterator[None]:
        """The device, between two engine steps; `sleep`: with the engine's memory released."""
        self._wanted.set()
        try:
            with self._lock:
                if sleep and self.engine is not None:
                    self.engine.sleep(level=1, mode="keep")
                try:
                    yield
                finally:
                    if sleep and self.engine is not None:
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
        self._stepper: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @classmethod
    def from_engine_args(cls, args: Any, turnstile: Turnstile) -> InprocLLM:
        from vllm.v1.engine.llm_engine import LLMEngine

        engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        turnstile.attach(engine, asyncio.get_running_loop())
        return cls(engine, turnstile)

    # --- requests --------------------------------------------------------------------------------

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """The request's final output (FINAL_ONLY requests are all we send)."""
        if self._failure is not None:
            raise PeerError(f"the in-process vLLM engine failed: {self._failure}")
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

    def shutdown(self, timeout: float | None = None) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
        for done in self._waiting.values():
            if not done.done():
                done.cancel()
        self._waiting.clear()
        self.engine.engine_core.shutdown()


@dataclass
class Colocation:
    """What the trainer and the in-process engine share: the device, and the engine itself, into
    which the trainer loads new weights while it holds the device."""

    turnstile: Turnstile = field(default_factory=Turnstile)
    sleep: bool = False  # release the engine's memory while the trainer steps (GPU)
    # Whether a training step takes the device from the engine. On a GPU it must (they share
    # its memory); on a CPU with cores to spare the engine, which vLLM keeps to one thread,
    # samples the next batch while the trainer steps on the other cores, as PipelineRL overlaps
    # them across processes. Weight loads always take the device.
    exclusive: bool = True
    engine: GenerationEngine | None = None  # once it has started
    started: threading.Event = field(default_factory=threading.Event)

    def start_engine(self, engine_args: Any) -> InprocLLM:
        return InprocLLM.from_engine_args(engine_args, self.turnstile)

    def ready(self, engine: GenerationEngine) -> None:
        """The engine has started: the trainer may load weights into it."""
        self.engine = engine
        self.started.set()

    def train(self) -> AbstractContextManager[None]:
        """The device for a training step: the engine stops stepping (and sleeps, on a GPU),
        unless training and generation share the cores (`exclusive` False)."""
        return self.turnstile.hold(sleep=self.sleep) if self.exclusive else nullcontext()

    def load(self, weights: Iterable[tuple[str, Tensor]], version: int, timeout_s: float) -> float:
        """The trainer's thread: load `weights` (by reference) into the engine as `version`,
        between two engine steps; returns the seconds it took. A resumed run's first load may
        come while the engine is still starting: it waits up to `timeout_s` for it."""
        if not self.started.wait(timeout_s) or self.engine is None:
            raise WeightSyncError(
                f"the engine did not start within {timeout_s:g} s to load version {version}"
            )
        with self.turnstile.hold(sleep=False):
            return self.engine.load_in_memory(weights, version)
