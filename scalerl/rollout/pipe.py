"""The rollout stream inside one process: the colocated mode's trainer and generator, on two
threads, exchange the same messages as over ZeroMQ (`scalerl.rollout.stream`), as objects.

`pipe()`'s two ends offer the methods of `TrainerChannel` and `GeneratorChannel`
that the trainer and generator call, so neither knows which stream it talks over. Nothing is
encoded: a rollout group reaches the trainer as the object the generator built.
"""

from __future__ import annotations

import os
import queue
import time

from scalerl.errors import PeerError
from scalerl.rollout.records import Hello, Message

GENERATOR = 0  # the one generator of a colocated run


class TrainerEnd:
    def __init__(self, up: queue.Queue[Message], down: queue.Queue[Message]) -> None:
        self._up, self._down = up, down
        self.generators: set[int] = set()
        self._pending: list[Message] = []

    def wait_for_generators(self, n: int, timeout_s: float) -> set[int]:
        deadline = time.monotonic() + timeout_s
        while len(self.generators) < n:
            message = self._get(max(deadline - time.monotonic(), 0.0))
            if message is None:
                raise PeerError(f"the engine thread did not start within {timeout_s:g} s")
            if isinstance(message, Hello):
                self.generators.add(message.generator)
            else:
                self._pending.append(message)
        return set(self.generators)

    def recv(self, timeout_s: float | None) -> tuple[int, Message] | None:
        if self._pending:
            return GENERATOR, self._pending.pop(0)
        message = self._get(timeout_s)
        return None if message is None else (GENERATOR, message)

    def send(self, generator: int, msg: Message, timeout_s: float | None = None) -> None:
        self._down.put(msg)

    def broadcast(self, msg: Message, timeout_s: float | None = None) -> list[int]:
        self._down.put(msg)
        return []  # the one generator shares this process: it cannot be gone

    def close(self) -> None:
        pass  # nothing to release: the queues go with the process

    def _get(self, timeout_s: float | None) -> Message | None:
        try:
            return self._up.get(timeout=timeout_s)
        except queue.Empty:
            return None


class GeneratorEnd:
    def __init__(self, up: queue.Queue[Message], down: queue.Queue[Message]) -> None:
        self._up, self._down = up, down
        self.generator = GENERATOR

    def hello(self, timeout_s: float = 30.0) -> None:
        self._up.put(Hello(generator=GENERATOR, pid=os.getpid()))

    def try_send(self, msg: Message) -> bool:
        self._up.put(msg)  # unbounded: the generator's quota bounds what it produces
        return True

    def recv(self, timeout_s: float | None) -> Message | None:
        try:
            if timeout_s is not None and timeout_s <= 0:
                return self._down.get_nowait()
            return self._down.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        pass


def pipe() -> tuple[TrainerEnd, GeneratorEnd]:
    """The trainer's end and the generator's end of one stream."""
    up: queue.Queue[Message] = queue.Queue()  # generator -> trainer
    down: queue.Queue[Message] = queue.Queue()  # trainer -> generator
    return TrainerEnd(up, down), GeneratorEnd(up, down)
