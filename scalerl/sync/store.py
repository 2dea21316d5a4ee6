"""The rendezvous store of a run's process groups (the weight-sync group, the trainer ranks),
behind the run's CURVE keys.

torch's `TCPStore` answers anyone who reaches its port: a stranger could list its keys, write a
rank's address or take a rank's place, and only a NetworkPolicy (which some network plugins
accept and do not enforce) kept strangers out. This store holds the same data at trainer 0 and
serves it over ZeroMQ with CURVE and the rollout stream's keys (`scalerl.rollout.keys`): a peer
without the run's client key gets no handshake, so with the address and the port it can neither
read nor write a key, and the group it would join never hears of it. Trainer 0 uses its table in
memory.

`KeyedStore` is a `torch.distributed.Store`, so the gloo and NCCL backends rendezvous through it
as through a TCPStore: `set`, `get` (waits for the key), `add`, `compare_set`, `wait`, `check`,
`delete_key`, `num_keys`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgpack
import torch.distributed as dist
import zmq

from scalerl.rollout.keys import ServerAuth, StreamKeys, apply_client

POLL_S = 0.01  # how often a waiting get or wait asks again
_REPLY_MS = 1000  # a request without a reply this long is sent again (the server may be starting)

Call = Callable[..., Any]


class Table:
    """The store's data; thread-safe. `call(op, *args)` is the one entry point, in process or
    from the server."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def call(self, op: str, *args: Any) -> Any:
        with self._lock:
            return getattr(self, f"_{op}")(*args)

    def _set(self, key: str, value: bytes) -> None:
        self._data[key] = value

    def _get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def _add(self, key: str, amount: int) -> int:
        total = int(self._data.get(key, b"0")) + amount
        self._data[key] = str(total).encode()
        return total

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self._data.get(key)
        if current == expected or (current is None and expected == b""):
            self._data[key] = desired
            return desired
        return expected if current is None else current

    def _check(self, keys: list[str]) -> bool:
        return all(key in self._data for key in keys)

    def _delete_key(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def _num_keys(self) -> int:
        return len(self._data)


OPS = ("set", "get", "add", "compare_set", "check", "delete_key", "num_keys")


class StoreServer:
    """Trainer 0's side: serves a `Table` on `host:port` to CURVE clients holding the run's
    client key, on a thread of its own."""

    def __init__(self, host: str, port: int, keys: StreamKeys) -> None:
        self.table = Table()
        self._context: zmq.Context[Any] = zmq.Context()
        self._auth = ServerAuth(self._context, keys)
        self._socket = self._context.socket(zmq.ROUTER)
        self._auth.apply(self._socket)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(f"tcp://{host}:{port}")
        # Each client's last request (client id -> sequence number, packed reply). A client
        # sends a request again until answered, and every copy it queued before the server was
        # up arrives: a copy is answered from here, so an `add` counts once.
        self._answered: dict[bytes, tuple[int, bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sync-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            # The envelope (peer identity, the REQ socket's request id, the empty delimiter)
            # goes back as it came; the last frame is the request.
            *envelope, payload = self._socket.recv_multipart()
            self._socket.send_multipart([*envelope, self._reply(payload)])

    def _reply(self, payload: bytes) -> bytes:
        """The packed reply to one request: carried out once per (client, sequence number)."""
        try:
            client, seq, *request = msgpack.unpackb(payload)
            if not isinstance(client, bytes) or not isinstance(seq, int) or seq < 1:
                raise ValueError("a request starts with the client's id and a sequence number")
        except Exception as err:  # a client's mistake must not stop the server
            return bytes(msgpack.packb([False, repr(err)]))
        done, reply = self._answered.get(client, (0, b""))
        if seq == done:
            return reply
        if seq < done:  # a late copy of a request answered long ago: its client has moved on
            return bytes(msgpack.packb([False, f"request {seq} was answered already"]))
        reply = bytes(msgpack.packb(self._answer(request)))
        self._answered[client] = (seq, reply)
        return reply

    def _answer(self, request: list[Any]) -> list[Any]:
        """[True, result] or [False, why]: a malformed request harms nothing."""
        try:
            op, *args = request
            if op not in OPS:
                return [False, f"unknown operation {op!r}"]
            return [True, self.table.call(op, *args)]
        except Exception as err:  # a client's mistake must not stop the server
            return [False, repr(err)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()
        self._auth.stop()
        self._context.term()


class Client:
    """A peer's side (a generator, a trainer rank other than 0): requests to the server, one at
    a time (the backends may call from several threads), each sent again until answered or
    `timeout_s` passed; the server carries out each request once however many copies arrive."""

    def __init__(self, host: str, port: int, keys: StreamKeys, timeout_s: float) -> None:
        self.address = f"{host}:{port}"
        self.timeout_s = timeout_s
        self._context: zmq.Context[Any] = zmq.Context()
        self._socket = self._context.socket(zmq.REQ)
        apply_client(self._socket, keys)
        # A request may go unanswered (the server not up yet): allow sending it again.
        self._socket.setsockopt(zmq.REQ_RELAXED, 1)
        self._socket.setsockopt(zmq.REQ_CORRELATE, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(f"tcp://{self.address}")
        self._lock = threading.Lock()
        # Who sends and which request: every copy of a request sent again carries the same pair.
        self._id, self._seq = os.urandom(16), 0

    def call(self, op: str, *args: Any) -> Any:
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            self._seq += 1
            request = msgpack.packb([self._id, self._seq, op, *args])
            while True:
                self._socket.send(request)
                if self._socket.poll(_REPLY_MS, zmq.POLLIN):
                    ok, result = msgpack.unpackb(self._socket.recv())
                    if not ok:
                        raise RuntimeError(f"sync store at {self.address}: {result}")
                    return result
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"sync store at {self.address} did not answer within {self.timeout_s:g} s"
                    )

    def close(self) -> None:
        self._socket.close()
        self._context.term()


class KeyedStore(dist.Store):
    """A `torch.distributed.Store` over a `Table` (trainer 0, with the server that shares it) or a
    `Client`; gets and waits poll until their keys exist or `timeout_s` passed."""

    def __init__(self, call: Call, timeout_s: float, close: Callable[[], None]) -> None:
        super().__init__()
        self._call, self.timeout_s, self._close = call, timeout_s, close

    @classmethod
    def serve(cls, host: str, port: int, keys: StreamKeys, timeout_s: float) -> KeyedStore:
        server = StoreServer(host, port, keys)
        return cls(server.table.call, timeout_s, server.close)

    @classmethod
    def connect(cls, host: str, port: int, keys: StreamKeys, timeout_s: float) -> KeyedStore:
        client = Client(host, port, keys, timeout_s)
        return cls(client.call, timeout_s, client.close)

    def set(self, key: str, value: bytes | str) -> None:
        self._call("set", key, _bytes(value))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while (value := self._call("get", key)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"key {key!r} not set within {self.timeout_s:g} s")
            time.sleep(POLL_S)
        return bytes(value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, amount))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return bytes(self._call("compare_set", key, _bytes(expected), _bytes(desired)))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = self.timeout_s if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise TimeoutError(f"keys {keys} not all set within {limit:g} s")
            time.sleep(POLL_S)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key))

    def num_keys(self) -> int:
        return int(self._call("num_keys"))

    def close(self) -> None:
        self._close()


def _bytes(value: bytes | str | list[int]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
