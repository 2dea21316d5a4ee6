"""Weight sync over a real 3-process gloo group: trainer rank 0 and two receivers."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

from scalerl.errors import WeightSyncError
from scalerl.ports import free_port
from scalerl.sync import SyncGroup, WeightReceiver, WeightSender, connect
from scalerl.sync.weights import ALIGN, _as_bytes, _checksum, _Piece, _survey

BUCKET = 1 << 20
WORLD = 3
Result = tuple[str, Any]


def state_dict(seed: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes and shapes; random bit patterns (NaNs included) so equality is bit-exact."""
    gen = torch.Generator().manual_seed(seed)

    def bits(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
        return raw.view(dtype).view(shape)

    tensors = {"embed.weight": bits((3 * BUCKET // 4 + 5, 1), torch.float32)}  # spans 4 buckets
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64]
    for i in range(60):
        shape = [(7,), (3, 5), (), (129, 3), (0, 4), (33, 17, 2)][i % 6]
        tensors[f"layers.{i}.w"] = bits(shape, dtypes[i % 4])
    tensors["lm_head.weight"] = bits((BUCKET // 2 + 3,), torch.bfloat16)
    tensors["mask"] = torch.rand(11, generator=gen) > 0.5
    return tensors


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def matches(received: list[tuple[str, torch.Tensor]], seed: int) -> bool:
    expected = state_dict(seed)
    names = [name for name, _ in received]
    return names == list(expected) and all(same_bits(t, expected[n]) for n, t in received)


class CorruptingSender(WeightSender):
    """Flips one byte of bucket `bad` after its checksum went out (the layout precedes it)."""

    bad = 2

    def _broadcast_bucket(self, index: int, data: torch.Tensor) -> None:
        if index == self.bad:
            data = data.clone()
            data[17] ^= 0xFF
        super()._broadcast_bucket(index, data)


class DyingSender(WeightSender):
    """Dies like a killed trainer after sending 3 of its 5 buckets (header and layout went)."""

    die_at = 3

    def _broadcast_bucket(self, index: int, data: torch.Tensor) -> None:
        if index == self.die_at:
            os._exit(17)
        super()._broadcast_bucket(index, data)


def _worker(rank: int, port: int, job: str, timeout_s: float, out: Any) -> None:
    torch.set_num_threads(1)  # three processes share two cores
    try:
        group = connect("127.0.0.1", port, WORLD, rank, timeout_s=timeout_s)
        with group:
            result = JOBS[job][0 if rank == 0 else 1](group)
        out.put((rank, ("ok", result)))
    except Exception as err:
        out.put((rank, ("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")))


def _send_two_versions(group: SyncGroup) -> list[tuple[int, int, int]]:
    sender = WeightSender(group, bucket_bytes=BUCKET)
    stats = [sender.send(state_dict(seed).items(), version=v) for seed, v in ((1, 7), (2, 8))]
    return [(s.version, s.bytes, s.buckets) for s in stats]


def _receive_two_versions(group: SyncGroup) -> list[tuple[int, bool, str]]:
    receiver = WeightReceiver(group)
    got = []
    for seed in (1, 2):
        version, tensors = receiver.receive(timeout_s=10)
        got.append((version, matches(tensors, seed), str(tensors[0][1].device)))
    return got


def _send_corrupt_then_good(group: SyncGroup) -> None:
    CorruptingSender(group, bucket_bytes=BUCKET).send(state_dict(1).items(), version=7)
    WeightSender(group, bucket_bytes=BUCKET).send(state_dict(2).items(), version=8)


def _receive_corrupt_then_good(group: SyncGroup) -> tuple[str, int, bool]:
    receiver = WeightReceiver(group)
    try:
        receiver.receive(timeout_s=10)
        message = "no error"
    except WeightSyncError as err:
        message = str(err)
    version, tensors = receiver.receive(timeout_s=10)  # the group survived the bad version
    return message, version, matches(tensors, 2)


def _send_then_die(group: SyncGroup) -> None:
    WeightSender(group, bucket_bytes=BUCKET).send(state_dict(1).items(), version=1)
    DyingSender(group, bucket_bytes=BUCKET).send(state_dict(2).items(), version=2)


def _receive_interrupted(group: SyncGroup) -> tuple[str, float, bool, int]:
    receiver = WeightReceiver(group)
    version, tensors = receiver.receive(timeout_s=10)
    weights = {name: t.clone() for name, t in tensors}  # what the generator runs on
    started = time.monotonic()
    try:
        version, tensors = receiver.receive(timeout_s=5)
        weights = dict(tensors)  # only a whole, verified version replaces the weights
        message = "no error"
    except WeightSyncError as err:
        message = str(err)
    elapsed = time.monotonic() - started
    return message, elapsed, matches(list(weights.items()), 1), version


def _send_to_a_dead_receiver(group: SyncGroup) -> tuple[str, float]:
    time.sleep(0.5)  # rank 1 is gone by now
    started = time.monotonic()
    try:
        WeightSender(group, bucket_bytes=BUCKET).send(state_dict(1).items(), version=1)
        message = "no error"
    except WeightSyncError as err:
        message = str(err)
    return message, time.monotonic() - started


def _die_or_receive(group: SyncGroup) -> str:
    if group.rank == 1:
        os._exit(0)
    try:
        WeightReceiver(group).receive(timeout_s=5)
        return "received"
    except WeightSyncError:
        return "failed"


JOBS: dict[str, tuple[Callable[[SyncGroup], Any], Callable[[SyncGroup], Any]]] = {
    "two_versions": (_send_two_versions, _receive_two_versions),
    "corrupt": (_send_corrupt_then_good, _receive_corrupt_then_good),
    "interrupted": (_send_then_die, _receive_interrupted),
    "dead_receiver": (_send_to_a_dead_receiver, _die_or_receive),
}


def run_group(job: str, timeout_s: float = 10.0) -> dict[int, Result]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "scalerl.sync"])
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, job, timeout_s, out)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    results: dict[int, Result] = {}
    deadline = time.monotonic() + 18
    try:
        while len(results) < WORLD and time.monotonic() < deadline:
            try:
                rank, result = out.get(timeout=0.2)
                results[rank] = result
            except queue.Empty:
                record_exits(procs, out, results)
    finally:
        for proc in procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
    return results


def record_exits(procs: list[Any], out: Any, results: dict[int, Result]) -> None:
    """A rank that died on purpose reports no result: record its exit code instead."""
    dead = [r for r, proc in enumerate(procs) if proc.exitcode is not None and r not in results]
    if not dead:
        return
    while True:  # a result put just before exiting is already in the pipe: take it first
        try:
            rank, result = out.get(timeout=0.1)
            results[rank] = result
        except queue.Empty:
            break
    for rank in dead:
        results.setdefault(rank, ("exit", procs[rank].exitcode))


def test_two_versions_arrive_bit_exact_on_every_receiver() -> None:
    results = run_group("two_versions")
    assert results[0][0] == "ok", results[0]
    (v1, bytes1, buckets1), (v2, _, _) = results[0][1]
    assert (v1, v2) == (7, 8)
    assert buckets1 == 5 and bytes1 > 4 * BUCKET  # one tensor spans 4 buckets, 60 share them
    for rank in (1, 2):
        assert results[rank] == ("ok", [(7, True, "cpu"), (8, True, "cpu")]), results[rank]


def test_corrupted_bucket_is_rejected_and_the_next_version_still_arrives() -> None:
    results = run_group("corrupt")
    assert results[0][0] == "ok", results[0]
    for rank in (1, 2):
        status, (message, version, ok) = results[rank]
        assert status == "ok"
        assert "bucket 2 (of" in message and "of version 7: checksum mismatch" in message
        assert "keeping the previous weights" in message
        assert (version, ok) == (8, True)


def test_killed_sender_raises_within_the_timeout_and_old_weights_stay() -> None:
    results = run_group("interrupted", timeout_s=5.0)
    assert results.get(0) == ("exit", 17), results.get(0)
    for rank in (1, 2):
        status, (message, elapsed, old_weights_intact, version) = results[rank]
        assert status == "ok", message
        assert message != "no error" and "unusable" in message, message
        assert elapsed < 5.5
        assert old_weights_intact and version == 1


def test_sender_raises_when_a_receiver_is_gone() -> None:
    results = run_group("dead_receiver", timeout_s=5.0)
    assert results[1] == ("exit", 0)
    status, (message, elapsed) = results[0]
    assert status == "ok" and "failed on rank 0 of 3" in message and "unusable" in message
    assert elapsed < 5.5


def test_connect_timeout_names_the_address_and_missing_ranks() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(WeightSyncError) as caught:
        connect("127.0.0.1", port, 3, 0, timeout_s=1.0)
    assert time.monotonic() - started < 5
    text = str(caught.value)
    assert f":{port}" in text and "rank 0 of world 3" in text and "ranks [1, 2]" in text


def test_connect_to_an_absent_trainer_fails_with_the_address() -> None:
    port = free_port()
    with pytest.raises(WeightSyncError) as caught:
        connect("127.0.0.1", port, 2, 1, timeout_s=1.0)
    assert f"127.0.0.1:{port}" in str(caught.value) and "rank 1 of world 2" in str(caught.value)


def test_piecewise_sender_checksum_equals_receiver_checksum_of_packed_bucket() -> None:
    tensors = list(state_dict(3).items())
    layout, expected = _survey(tensors, BUCKET, torch.device("cpu"))
    flat = torch.zeros(layout.total, dtype=torch.uint8)
    for slot, (_, tensor) in zip(layout.slots, tensors, strict=True):
        flat[slot.offset : slot.end] = _as_bytes(tensor)
    for index in range(layout.buckets):
        low, high = layout.bucket_range(index)
        bucket = flat[low:high]
        got = _checksum([_Piece(0, 0, high - low, 0)], [bucket], high - low, torch.device("cpu"))
        assert got == expected[index]


def test_checksum_catches_a_tensor_written_at_another_tensors_offset() -> None:
    rows = torch.randint(0, 256, (4 * ALIGN,), dtype=torch.uint8)
    swapped = torch.cat([rows[ALIGN : 2 * ALIGN], rows[:ALIGN], rows[2 * ALIGN :]])
    whole = [_Piece(0, 0, rows.numel(), 0)]
    cpu = torch.device("cpu")
    assert (
        _checksum(whole, [rows], rows.numel(), cpu)[1]
        == _checksum(whole, [swapped], rows.numel(), cpu)[1]
    )  # same plain sum ...
    assert _checksum(whole, [rows], rows.numel(), cpu) != _checksum(
        whole, [swapped], rows.numel(), cpu
    )  # ... but the position-weighted sum differs
