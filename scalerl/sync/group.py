"""The weight-sync process group: trainer rank 0 plus every generator receiver.

The group is built from a store (the run's authenticated one, `scalerl.sync.store`, or a
`TCPStore`) and a backend object (`ProcessGroupGloo` on CPU,
`ProcessGroupNCCL` on GPUs) and never through `torch.distributed.init_process_group`: the
receiver runs inside a vLLM worker that already owns the default group, so everything here talks
to the backend object directly.

A collective that fails or times out leaves the peers' sockets or communicators in an unknown
state (gloo closes the pair), so the first failure marks the group broken and every later call
raises at once instead of pairing up with the wrong message. Reconnect to recover.

Generations: a run's group is formed again whenever its generators change (one died, a replacement
joined, the pool was scaled). Each formation is a generation with keys of its own in the store
(`scalerl/sync/<generation>/`), so the ranks of generation n never meet a leftover of n - 1.
Trainer rank 0 serves the store for the whole run (`serve_meeting`) and forms every generation on
it; a receiver connects to it anew for each generation it joins.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import zmq
from torch import Tensor

from scalerl.errors import InputError, WeightSyncError
from scalerl.rollout.keys import StreamKeys
from scalerl.sync.store import KeyedStore

_PREFIX = "scalerl/sync/"
# How long the members of a new generation have to join it: they are up and only need to hear of
# it (a generator's command loop answers within a second); one that does not is taken for lost.
REJOIN_S = 30.0
# While a generation forms, how often rank 0 asks whether a member it waits for is gone.
GONE_POLL_S = 0.5
# Gloo's timeout for building its mesh once every rank has joined. Among live ranks the mesh takes
# milliseconds (each enters it within moments of the last join), but gloo tries a connection to a
# rank that died mid-mesh five times, each for the whole timeout it was given: a generator killed
# as its group formed held the trainer 150 s of a 30 s rejoin (tests/sync/test_generations.py).
MESH_S = 5.0
_JOIN_POLL_S = 0.02
# Where rank 0 leaves word that it gave a generation up (the ranks it stopped waiting for).
_GIVEN_UP = "given-up"
# Asked while a generation forms: the ranks (or, above this module, the generators) whose
# processes are known to be gone.
Gone = Callable[[], list[int]]
# NCCL work is polled rather than waited on so that a dead peer becomes an error, not a hang.
_NCCL_POLL_S = 0.001


class RanksMissing(WeightSyncError):
    """A generation did not form: `missing` are the ranks that never joined (None: unknown)."""

    def __init__(self, message: str, missing: list[int] | None) -> None:
        super().__init__(message)
        self.missing = missing


class SyncGroup:
    """A process group apart from the default one; rank 0 is the trainer and the source."""

    rank: int
    world_size: int
    device: torch.device

    def __init__(
        self,
        backend: Any,
        store: dist.Store,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout_s: float,
        address: str,
        owns_store: bool = True,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.address = address
        self._backend: Any = backend
        self._store: dist.Store | None = store
        self._owns_store = owns_store  # False: the run's store outlives this generation
        self._broken: str | None = None

    @property
    def broken(self) -> str | None:
        """Why the group can no longer be used, or None while it is healthy."""
        return self._broken

    def broadcast(self, tensor: Tensor, src: int = 0, *, timeout_s: float | None = None) -> None:
        """Broadcast `tensor` in place from rank `src`; blocks until this rank's part is done.

        `timeout_s` bounds this one collective (default: the group's timeout). Raises
        WeightSyncError on timeout or a lost peer, after which the group is broken.
        """
        self._check_usable()
        if tensor.device != self.device:
            raise InputError(
                f"sync group broadcasts on {self.device}, got a tensor on {tensor.device}"
            )
        if not tensor.is_contiguous():
            raise InputError("sync group broadcasts need contiguous tensors")
        limit = self.timeout_s if timeout_s is None else max(timeout_s, 0.001)
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        opts.timeout = timedelta(seconds=limit)
        try:
            work = self._backend.broadcast([tensor], opts)
            if self.device.type == "cuda":
                _wait_polling(work, limit)
            else:
                work.wait()
        except Exception as err:  # every backend failure means the same to us
            self._broken = _first_line(err)
            if self.device.type == "cuda":
                _abort(self._backend)
            raise WeightSyncError(
                f"broadcast of {tensor.numel() * tensor.element_size()} bytes from rank {src} "
                f"failed on rank {self.rank} of {self.world_size} ({self.address}): "
                f"{self._broken}; the sync group is now unusable, reconnect"
            ) from err

    def mark_broken(self, reason: str) -> None:
        """Record that the peers lost step (e.g. an unreadable header); later calls raise."""
        self._broken = self._broken or reason

    def close(self) -> None:
        """Release the backend and the store; safe to call twice."""
        if self._backend is not None:
            shutdown = getattr(self._backend, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # a broken group may not shut down cleanly
                    pass
        self._backend = None
        if self._owns_store:
            close_store(self._store)
        self._store = None
        self._broken = self._broken or "closed"

    def __enter__(self) -> SyncGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_usable(self) -> None:
        if self._backend is None:
            raise WeightSyncError(f"sync group {self.address} is closed")
        if self._broken is not None:
            raise WeightSyncError(
                f"sync group {self.address} is broken by an earlier failure ({self._broken}); "
                "reconnect"
            )


def connect(
    host: str,
    port: int,
    world_size: int,
    rank: int,
    *,
    timeout_s: float = 60.0,
    join_timeout_s: float | None = None,
    backend: str | None = None,
    keys: StreamKeys | None = None,
    generation: int = 0,
    store: dist.Store | None = None,
    gone: Gone | None = None,
) -> SyncGroup:
    """Join generation `generation` of the weight-sync group; blocks until all `world_size` ranks
    joined or `join_timeout_s` (default `timeout_s`: at a gang's start the ranks may join minutes
    apart). `gone`, asked every `GONE_POLL_S` while the ranks are awaited, names the ranks whose
    processes are known to be gone: the wait ends at once with RanksMissing naming them (a process
    killed just before a generation forms may still have looked alive when it was told to join,
    and would otherwise be awaited the whole join timeout). Rank 0 passes the run's `store`
    (`serve_meeting`) to form a generation on it; the group then leaves the store open when it
    closes.

    Rank 0 creates the TCPStore listening on `host:port` only ("127.0.0.1" in local runs, so no
    one else on the network can join; "0.0.0.0" in a pod, where the Service DNS name the others
    use is not the pod's own); the others connect to `host:port`. `backend` is
    "gloo", "nccl" or None (NCCL when CUDA is available, else gloo). `timeout_s` is also the
    default limit of every later collective. With the run's `keys` the ranks meet through the
    CURVE-authenticated store of `scalerl.sync.store` (only the run's peers reach it), without
    them through a TCPStore.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise InputError(
            f"sync group needs 0 <= rank < world_size, got rank {rank} of {world_size}"
        )
    use_nccl = _choose_nccl(backend)
    address = f"{host}:{port}"
    where = f"sync group at {address}: rank {rank} of world {world_size}, generation {generation}"
    joining_s = timeout_s if join_timeout_s is None else join_timeout_s
    deadline = time.monotonic() + joining_s
    owned = store is None
    base = store if store is not None else meeting_store(host, port, rank, keys, joining_s, where)
    prefix = f"{_PREFIX}{generation}"  # PrefixStore puts the "/" after it
    try:
        return _form(
            base, prefix, rank, world_size, deadline, where, use_nccl, timeout_s, address, owned,
            gone,
        )  # fmt: skip
    except BaseException:
        if owned:
            close_store(base)  # a group that did not form leaves no server or client behind
        raise


def serve_meeting(host: str, port: int, keys: StreamKeys | None, timeout_s: float) -> dist.Store:
    """Rank 0's store for the whole run, which every generation of the group meets on."""
    return meeting_store(host, port, 0, keys, timeout_s, f"sync group at {host}:{port}")


def _form(
    base: dist.Store,
    prefix: str,
    rank: int,
    world_size: int,
    deadline: float,
    where: str,
    use_nccl: bool,
    timeout_s: float,
    address: str,
    owns_store: bool,
    gone: Gone | None,
) -> SyncGroup:
    store = dist.PrefixStore(prefix, base)
    _join(store, rank, world_size, deadline, where, gone)
    device = torch.device("cuda", torch.cuda.current_device()) if use_nccl else torch.device("cpu")
    remaining = max(deadline - time.monotonic(), 0.001)
    try:
        # NCCL connects in the first broadcast below, which polls to `remaining` itself.
        mesh_s = remaining if use_nccl else min(remaining, MESH_S)
        made = _make_backend(store, rank, world_size, mesh_s, use_nccl)
    except Exception as err:  # backend constructors raise plain RuntimeErrors
        raise WeightSyncError(f"{where}: could not build the backend: {_first_line(err)}") from err
    group = SyncGroup(
        made,
        base,
        rank=rank,
        world_size=world_size,
        device=device,
        timeout_s=timeout_s,
        address=address,
        owns_store=owns_store,
    )
    # One tiny collective proves every link works; NCCL builds its communicator here.
    group.broadcast(torch.zeros(1, device=device), src=0, timeout_s=remaining)
    return group


def meeting_store(
    host: str, port: int, rank: int, keys: StreamKeys | None, timeout_s: float, where: str
) -> dist.Store:
    """Where a process group's ranks meet (rank 0 serves it on `host:port`): with the run's
    `keys`, the CURVE-authenticated store, which only the run's peers reach; without (tests, a
    process that has no keys), a TCPStore."""
    if keys is None:
        return open_store(host, port, rank, timeout_s, where)
    return keyed_store(host, port, rank, keys, timeout_s, where)


def open_store(host: str, port: int, rank: int, timeout_s: float, where: str) -> dist.Store:
    """A TCPStore: rank 0 serves it on `host:port` only, the others connect to it."""
    is_master = rank == 0
    try:
        return dist.TCPStore(
            host,
            port,
            None,
            is_master,
            timedelta(seconds=timeout_s),
            wait_for_workers=False,
            # TCPStore's own server listens on every interface whatever `host` says; a socket we
            # bind ourselves keeps it to `host`. detach(): the store owns the descriptor now.
            master_listen_fd=_listen(host, port).detach() if is_master else None,
        )
    except Exception as err:  # DistNetworkError, TimeoutError, RuntimeError
        action = "could not listen on the store port" if is_master else "could not reach the store"
        raise WeightSyncError(
            f"{where}: {action} within {timeout_s:g} s: {_first_line(err)}"
        ) from err


def keyed_store(
    host: str, port: int, rank: int, keys: StreamKeys, timeout_s: float, where: str
) -> KeyedStore:
    """Rank 0 serves the authenticated store on `host:port`; the others reach it there."""
    try:
        if rank == 0:
            return KeyedStore.serve(host, port, keys, timeout_s)
        return KeyedStore.connect(host, port, keys, timeout_s)
    except zmq.ZMQError as err:
        action = "could not listen on the store port" if rank == 0 else "could not reach the store"
        raise WeightSyncError(f"{where}: {action}: {err}") from err


def close_store(store: dist.Store | None) -> None:
    """Stop an authenticated store's server or client (a TCPStore closes with its object)."""
    if isinstance(store, KeyedStore):
        store.close()


def _listen(host: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


def _join(
    store: dist.Store,
    rank: int,
    world_size: int,
    deadline: float,
    where: str,
    gone: Gone | None,
) -> None:
    """Wait until every rank announced itself, naming the missing ones on timeout, or the ones
    `gone` reports as soon as it reports any. A generation rank 0 gives up is given up by all:
    rank 0 leaves word in the store, and a member waiting for a rank that will never come
    (killed as the generation formed) stops at once, free to join the next generation, which
    rank 0 would otherwise wait for it in."""
    keys = [f"joined/{r}" for r in range(world_size)]
    started = time.monotonic()
    if rank != 0:
        gone = _given_up_by_rank_0(store)
    try:
        store.set(keys[rank], "1")
        if gone is None:
            store.wait(keys, timedelta(seconds=max(deadline - started, 0.001)))
            lost = []
        else:
            lost = _wait_unless_gone(store, keys, deadline, gone)
    except Exception as err:  # the store raises DistStoreError, TimeoutError or RuntimeError
        missing = _missing_ranks(store, keys)
        waited = time.monotonic() - started
        if rank == 0 and isinstance(missing, list):
            _give_up(store, missing)
        raise RanksMissing(
            f"{where}: timed out after {waited:.1f} s waiting for ranks {missing} to join "
            f"({_first_line(err)})",
            missing if isinstance(missing, list) else None,
        ) from err
    if lost:
        waited = time.monotonic() - started
        if rank == 0:
            _give_up(store, lost)
            why = f"ranks {lost} are gone; stopped waiting for them after {waited:.1f} s"
        else:
            why = (f"rank 0 gave this generation up after {waited:.1f} s (ranks {lost} are "
                   "gone); the next one follows")  # fmt: skip
        raise RanksMissing(f"{where}: {why}", lost)


def _give_up(store: dist.Store, missing: list[int]) -> None:
    """Rank 0's word to the members still waiting: this generation will not form."""
    try:
        store.set(_GIVEN_UP, json.dumps(missing))
    except Exception:  # a store that is gone tells the members as much
        pass


def _given_up_by_rank_0(store: dist.Store) -> Gone:
    """A member's `gone`: the ranks rank 0 gave the generation up for, once it has."""

    def given_up() -> list[int]:
        if not store.check([_GIVEN_UP]):
            return []
        return json.loads(store.get(_GIVEN_UP)) or [0]  # none named: rank 0 itself left

    return given_up


def _wait_unless_gone(store: dist.Store, keys: list[str], deadline: float, gone: Gone) -> list[int]:
    """Wait for `keys`; the ranks `gone` names the first time it names any ([]: all joined)."""
    asked = time.monotonic()
    while not store.check(keys):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"keys {keys} not all set in time")
        if now - asked >= GONE_POLL_S:
            asked = now
            if lost := gone():
                return lost
        time.sleep(_JOIN_POLL_S)
    return []


def _missing_ranks(store: dist.Store, keys: list[str]) -> list[int] | str:
    try:
        return [r for r, key in enumerate(keys) if not store.check([key])]
    except Exception:  # the store itself may be gone
        return "unknown (store unreachable)"


def _choose_nccl(backend: str | None) -> bool:
    if backend not in (None, "gloo", "nccl"):
        raise InputError(f"sync backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise InputError("sync backend 'nccl' needs CUDA; use 'gloo' or leave it unset")
    return backend != "gloo" and torch.cuda.is_available()


def _make_backend(store: dist.Store, rank: int, world: int, timeout_s: float, nccl: bool) -> Any:
    timeout = timedelta(seconds=timeout_s)
    if not nccl:
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    nccl_class = getattr(dist, "ProcessGroupNCCL", None)
    if nccl_class is None:
        raise InputError("this torch build has no NCCL; use backend='gloo'")
    options = nccl_class.Options()
    options._timeout = timeout
    options.is_high_priority_stream = False
    return nccl_class(store, rank, world, options)


def _wait_polling(work: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError(f"collective did not complete within {timeout_s:g} s")
        time.sleep(_NCCL_POLL_S)
    work.wait()
    torch.cuda.current_stream().synchronize()


def _abort(backend: Any) -> None:
    abort = getattr(backend, "abort", None)
    if callable(abort):
        try:
            abort()
        except Exception:  # best effort on an already failed communicator
            pass


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
