"""What the colocated mode's trainer and its in-process engine share: the device, taken in turns
(`Turnstile`), and the engine, into which the trainer loads new weights (`Colocation`).

`Turnstile` lets another thread (the trainer) take the device between two engine steps: the
engine's stepper (`scalerl.generator.inproc`) never starts a step while the trainer holds it. On
a GPU training and generation take turns this way (with the engine asleep while the trainer
steps; see `Turnstile.hold`); on a CPU they share the cores or take turns, whichever the run
measures to be faster (`CoreShare`). The trainer
loads new weights while it holds the device (`Colocation.load`): in-flight requests are frozen
with their KV cache, as by a pause, and continue on the new weights.

Nothing here knows the engine's type (`InMemoryEngine` is all it needs), so the engine's modules
import this one and not the other way round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from scalerl.errors import WeightSyncError

if TYPE_CHECKING:
    from torch import Tensor
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine

log = logging.getLogger("scalerl.colocation")


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
class CoreShare:
    """On a CPU: whether a training step leaves the engine a core, so that it samples the next
    batch meanwhile (PipelineRL's overlap, the trainer on the other cores), or takes every core
    while the engine waits (turns, as on a GPU). vLLM keeps its engine to one thread either way.

    Which is faster depends on the run, so the run measures both. On 2 cores with LoRA, per
    step: the demo's 0.6 M-parameter model 0.18 s sharing against 0.29 s in turns (sampling is
    most of its work); a 25 M-parameter model, whose trainer's step is most of the work, once
    measured 3.85 s sharing against 2.77 s in turns. The first `window` steps after the first
    take turns, the next `window` share, and the run keeps whichever spent fewer steady seconds
    (the trainer's wall time less evaluations and checkpoints) per step. `window` is a multiple
    of the usual PPO-off-policy k (1, 2, 4), so each trial sees as many waits for a new
    policy's batches as the other.
    """

    cores: int
    window: int = 4
    # This step's way. Turns first: the trainer's threads are made before the engine starts,
    # which then pins its own, and a thread torch adds later may share the engine's core.
    exclusive: bool = True
    chosen: bool = False
    skipped_first: bool = False  # the first step pays start-up (caches, the first batch)
    spent: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})

    def __post_init__(self) -> None:
        self.apply()

    def apply(self) -> None:
        """Torch's CPU threads for the trainer's thread (OpenMP's count is per thread): every
        core in turns, all but the engine's when sharing. vLLM's CPU worker replaces
        `torch.set_num_threads` by a no-op in its process once it binds its own threads, which
        silently left the trainer at one count: torch's own function is called instead."""
        torch._C.set_num_threads(self.cores if self.exclusive else self.cores - 1)

    def observe(self, seconds: float) -> None:
        """The trainer's thread, after each step: its steady `seconds`."""
        if self.chosen:
            return
        if not self.skipped_first:
            self.skipped_first = True
            return
        trial = self.spent[self.exclusive]
        trial.append(seconds)
        if len(trial) < self.window:
            return
        if self.exclusive and not self.spent[False]:
            self.exclusive = False  # in turns for a window: now sharing
        else:
            shared, turns = (sum(self.spent[way]) / self.window for way in (False, True))
            self.exclusive, self.chosen = turns < shared, True
            log.info(
                "CPU cores: %.2f s per step sharing them with the engine, %.2f s in turns; "
                "%s from now on",
                shared,
                turns,
                "turns" if self.exclusive else "sharing",
            )
        self.apply()


@dataclass
class Colocation:
    """What the trainer and the in-process engine share: the device, and the engine itself, into
    which the trainer loads new weights while it holds the device."""

    turnstile: Turnstile = field(default_factory=Turnstile)
    sleep: bool = False  # release the engine's memory while the trainer steps (GPU)
    # Whether a training step takes the device from the engine. On a GPU it must (they share
    # its memory), and on a single core; on a CPU with more, `share` decides, step by step.
    # Weight loads always take the device.
    exclusive: bool = True
    share: CoreShare | None = None
    engine: InMemoryEngine | None = None  # once it has started
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.share is not None:
            self.exclusive = self.share.exclusive

    def stepped(self, seconds: float) -> None:
        """The trainer's thread, after each step: its steady `seconds` (see `CoreShare`)."""
        if self.share is not None:
            self.share.observe(seconds)
            self.exclusive = self.share.exclusive

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
