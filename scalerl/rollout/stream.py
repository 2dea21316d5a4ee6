"""The generator <-> trainer channel: one ZeroMQ ROUTER at the trainer, one DEALER per generator.

Rollouts and replies flow up, commands flow down, all as `records` messages (one frame each;
the ROUTER adds the sender's identity: `<generator index>/<nonce of its process>`). Both ends are
bounded: at most `max_in_flight` messages queue per direction and peer (plus what the OS socket
buffers hold), so a trainer that stops reading makes the generators' `send` block, and a block
longer than its timeout becomes a `PeerError` instead of a hang. LINGER is bounded too, so
`close` never hangs on a dead peer. Sockets are not thread-safe: use each channel from one thread.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections import deque
from typing import Any

import zmq

from scalerl.errors import InputError, PeerError
from scalerl.rollout.keys import ServerAuth, StreamKeys, apply_client
from scalerl.rollout.records import Hello, Message, decode, encode

_RETRY_S = 0.005
# A generator process's identity on the channel: its index, and a nonce of the process. A
# replacement under the same index is then another peer: a send meant for the process that died
# fails at once (EHOSTUNREACH) even while its replacement is connected, and what the dead one left
# queued is told apart from what the new one says.
_IDENTITY = re.compile(rb"(\d+)/[0-9a-f]+")

log = logging.getLogger(__name__)


def _ms(timeout_s: float | None) -> int | None:
    return None if timeout_s is None else max(int(timeout_s * 1000), 0)


def _socket(
    kind: int, max_in_flight: int, linger_s: float
) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    if max_in_flight < 1:
        raise InputError(f"max_in_flight must be at least 1, got {max_in_flight}")
    context = zmq.Context()
    sock = context.socket(kind)
    sock.setsockopt(zmq.SNDHWM, max_in_flight)
    sock.setsockopt(zmq.RCVHWM, max_in_flight)
    sock.setsockopt(zmq.LINGER, int(linger_s * 1000))
    return context, sock


class GeneratorGone(PeerError):
    """The generator is not connected: it never was, or its process ended."""


class TrainerChannel:
    """The trainer's end: binds `bind` (e.g. "tcp://127.0.0.1:5555"), talks to every generator;
    with `keys`, only generators holding the run's client key."""

    def __init__(
        self,
        bind: str,
        *,
        keys: StreamKeys | None = None,
        max_in_flight: int = 64,
        send_timeout_s: float = 30.0,
        linger_s: float = 1.0,
    ) -> None:
        self._context, self._socket = _socket(zmq.ROUTER, max_in_flight, linger_s)
        self._auth = ServerAuth(self._context, keys) if keys is not None else None
        if self._auth is not None:
            self._auth.apply(self._socket)
        # Unroutable sends raise instead of vanishing.
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._socket.bind(bind)
        except zmq.ZMQError as err:
            self.close()
            raise PeerError(f"trainer channel cannot bind {bind}: {err}") from err
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.send_timeout_s = send_timeout_s
        self.generators: set[int] = set()
        # generator -> the identity of its process that said hello last
        self._routes: dict[int, bytes] = {}
        self.hellos: dict[int, Hello] = {}  # generator -> its process's hello (pid, host)
        self._pending: deque[tuple[int, Message]] = deque()

    def wait_for_generators(self, n: int, timeout_s: float) -> set[int]:
        """Collect Hello messages until `n` generators are known; other messages are kept for
        `recv`. Raises PeerError naming who is missing when `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while len(self.generators) < n:
            got = self._receive(max(deadline - time.monotonic(), 0.0))
            if got is None:
                raise PeerError(
                    f"only {len(self.generators)} of {n} generators said hello to "
                    f"{self.endpoint} within {timeout_s:g} s: {sorted(self.generators)}"
                )
            if not isinstance(got[1], Hello):
                self._pending.append(got)
        return set(self.generators)

    def recv(self, timeout_s: float | None) -> tuple[int, Message] | None:
        """The next `(generator, message)`, or None after `timeout_s` (None waits forever)."""
        if self._pending:
            return self._pending.popleft()
        return self._receive(timeout_s)

    def send(self, generator: int, msg: Message, timeout_s: float | None = None) -> None:
        """Queue `msg` for one generator; PeerError if it is unknown or takes nothing for
        `timeout_s` (default: the channel's send_timeout_s)."""
        self._send_bytes(generator, encode(msg), timeout_s)

    def broadcast(self, msg: Message, timeout_s: float | None = None) -> list[int]:
        """Send `msg` to every generator that said hello; those no longer connected (a process
        that died: its replacement says hello again) are forgotten and returned."""
        payload = encode(msg)
        gone = []
        for generator in sorted(self.generators):
            try:
                self._send_bytes(generator, payload, timeout_s)
            except GeneratorGone:
                gone.append(generator)
        return gone

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if not self._context.closed:
            self._context.term()

    def __enter__(self) -> TrainerChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self, timeout_s: float | None) -> tuple[int, Message] | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not self._socket.poll(_ms(remaining), zmq.POLLIN):
                return None
            got = self._take(*self._socket.recv_multipart(zmq.NOBLOCK))
            if got is not None:
                return got

    def _take(self, *frames: bytes) -> tuple[int, Message] | None:
        """One received message as `(generator, message)`; None for what a generator process
        that was replaced left behind."""
        if len(frames) != 2:
            raise InputError(f"expected [identity, message] frames, got {len(frames)} frames")
        identity, payload = frames
        match = _IDENTITY.fullmatch(identity)
        if match is None:
            raise InputError(f"message from a peer that is not a generator (identity {identity!r})")
        generator = int(match[1])
        msg = decode(payload)
        if isinstance(msg, Hello):  # a process (the first, or a replacement) takes the index
            self.generators.add(generator)
            self._routes[generator] = identity
            self.hellos[generator] = msg
        elif self._routes.get(generator, identity) != identity:
            log.info(
                "dropped %s of a replaced process of generator %d", type(msg).__name__, generator
            )
            return None
        return generator, msg

    def _send_bytes(self, generator: int, payload: bytes, timeout_s: float | None) -> None:
        limit = self.send_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        identity = self._routes.get(generator)
        if identity is None:
            raise GeneratorGone(f"generator {generator} is not connected to {self.endpoint}")
        frames = [identity, payload]
        while True:
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK)
                return
            except zmq.Again:  # this generator's queue is full: it is not reading
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"generator {generator} took no message from {self.endpoint} "
                        f"for {limit:g} s"
                    ) from None
                time.sleep(_RETRY_S)
            except zmq.ZMQError as err:
                if err.errno == zmq.EHOSTUNREACH:  # its process ended
                    self.generators.discard(generator)
                    del self._routes[generator]
                    raise GeneratorGone(
                        f"generator {generator} is not connected to {self.endpoint}"
                    ) from err
                raise


class GeneratorChannel:
    """A generator's end: connects to the trainer at `connect` as generator `generator` (with
    the run's `keys` when the trainer requires them)."""

    def __init__(
        self,
        connect: str,
        generator: int,
        *,
        keys: StreamKeys | None = None,
        max_in_flight: int = 64,
        linger_s: float = 1.0,
    ) -> None:
        self.address = connect
        self.generator = generator
        self.max_in_flight = max_in_flight
        self._unsent: tuple[Message, bytes] | None = None  # held by try_send between retries
        self._context, self._socket = _socket(zmq.DEALER, max_in_flight, linger_s)
        self._socket.setsockopt(zmq.IDENTITY, f"{generator}/{os.urandom(6).hex()}".encode())
        if keys is not None:
            apply_client(self._socket, keys)
        # Queue nothing until the trainer is really there: an unreachable trainer blocks `send`.
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        try:
            self._socket.connect(connect)
        except zmq.ZMQError as err:
            self.close()
            raise InputError(f"bad trainer address {connect!r}: {err}") from err

    def hello(self, timeout_s: float = 30.0) -> None:
        """Announce this generator (index and pid) to the trainer."""
        hello = Hello(generator=self.generator, pid=os.getpid(), host=socket.gethostname())
        self.send(hello, timeout_s=timeout_s)

    def send(self, msg: Message, timeout_s: float = 30.0) -> None:
        """Queue `msg` for the trainer, blocking while `max_in_flight` messages are queued;
        PeerError when the trainer takes nothing for `timeout_s`."""
        payload = encode(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            if self._socket.poll(_ms(remaining), zmq.POLLOUT):
                try:
                    self._socket.send(payload, zmq.NOBLOCK)
                    return
                except zmq.Again:  # the queue filled between poll and send
                    pass
            if time.monotonic() >= deadline:
                raise PeerError(
                    f"trainer at {self.address} not reachable for {timeout_s:g} s "
                    f"(down, or not reading: {self.max_in_flight} messages already queued)"
                )
            time.sleep(_RETRY_S)

    def try_send(self, msg: Message) -> bool:
        """Queue `msg` if there is room now; False when `max_in_flight` messages are queued or the
        trainer is unreachable. For event loops that must not block: retry later with the same
        object, which is then not encoded again."""
        if self._unsent is None or self._unsent[0] is not msg:
            self._unsent = (msg, encode(msg))
        try:
            self._socket.send(self._unsent[1], zmq.NOBLOCK)
        except zmq.Again:
            return False
        self._unsent = None
        return True

    def recv(self, timeout_s: float | None) -> Message | None:
        """The next command from the trainer, or None after `timeout_s` (None waits forever)."""
        if not self._socket.poll(_ms(timeout_s), zmq.POLLIN):
            return None
        return decode(self._socket.recv(zmq.NOBLOCK))

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close()
        if not self._context.closed:
            self._context.term()

    def __enter__(self) -> GeneratorChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
