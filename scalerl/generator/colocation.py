"""What the colocated mode's trainer and its in-process engine share: the device, taken in turns
(`Turnstile`), and the engine, into which the trainer loads new weights (`Colocation`).

`Turnstile` lets another thread (the trainer) take the device between two engine steps: the
engine's stepper (`scalerl.generator.inproc`) never starts a step while the trainer holds it. On
a GPU training and generation take turns this way (with the engine asleep while the trainer
steps; see `Turnstile.hold`); on a CPU they share the cores (`Colocation.exclusive`). The trainer
loads new weights while it holds the device (`Colocation.load`): in-flight requests are frozen
with their KV cache, as by a pause, and continue on the new weights.

Nothing here knows the engine's type (`InMemoryEngine` is all it needs), so the engine's modules
import this one and not the other way round.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

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


class InMemoryEngine(Protocol):
    """The engine as the trainer's loads see it (`GenerationEngine.load_in_memory`)."""

    def load_in_memory(self, weights: Iterable[tuple[str, Tensor]], version: int) -> float: ...

    def adapter_folder(self, version: int) -> Path: ...

    def load_adapter(self, folder: Path, version: int) -> float: ...


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
    engine: InMemoryEngine | None = None  # once it has started
    started: threading.Event = field(default_factory=threading.Event)

    def ready(self, engine: InMemoryEngine) -> None:
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
        engine = self._started_engine(version, timeout_s)
        with self.turnstile.hold(sleep=False):
            return engine.load_in_memory(weights, version)

    def load_adapter(self, save: Callable[[Path], None], version: int, timeout_s: float) -> float:
        """LoRA, the trainer's thread: `save` the adapter as a folder where the engine keeps
        them (in memory), then load it into the engine's adapter slot as `version`, between two
        engine steps; returns the seconds both took."""
        engine = self._started_engine(version, timeout_s)
        started = time.monotonic()
        folder = engine.adapter_folder(version)
        save(folder)
        with self.turnstile.hold(sleep=False):
            engine.load_adapter(folder, version)
        return time.monotonic() - started

    def _started_engine(self, version: int, timeout_s: float) -> InMemoryEngine:
        if not self.started.wait(timeout_s) or self.engine is None:
            raise WeightSyncError(
                f"the engine did not start within {timeout_s:g} s to load version {version}"
            )
        return self.engine
