"""Edge cases of the weight sync, with the two ranks of a real gloo group in two threads."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import torch

from scalerl.errors import InputError, WeightSyncError
from scalerl.ports import free_port
from scalerl.sync import SyncGroup, WeightReceiver, WeightSender, connect
from scalerl.sync.weights import _Header


def pair(
    trainer: Callable[[SyncGroup], Any], generator: Callable[[SyncGroup], Any], timeout_s: float = 5
) -> tuple[Any, Any]:
    """Runs rank 0 and rank 1 of a fresh group in two threads; re-raises the first failure."""
    port = free_port()
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(rank: int, body: Callable[[SyncGroup], Any]) -> None:
        try:
            with connect("127.0.0.1", port, 2, rank, timeout_s=timeout_s) as group:
                results[rank] = body(group)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run, args=a) for a in ((0, trainer), (1, generator))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    if errors:
        raise errors[0]
    return results[0], results[1]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def test_empty_versions_and_zero_size_tensors_round_trip() -> None:
    versions = [[], [("empty", torch.zeros(0, 3)), ("scalar", torch.tensor(2.5))]]

    def trainer(group: SyncGroup) -> list[int]:
        sender = WeightSender(group, bucket_bytes=1024)
        return [sender.send(tensors, version=v).buckets for v, tensors in enumerate(versions)]

    def generator(group: SyncGroup) -> list[tuple[int, list[tuple[str, torch.Tensor]]]]:
        receiver = WeightReceiver(group)
        return [receiver.receive(timeout_s=5) for _ in versions]

    buckets, received = pair(trainer, generator)
    assert buckets == [0, 1]
    assert received[0] == (0, [])
    version, tensors = received[1]
    assert version == 1 and [n for n, _ in tensors] == ["empty", "scalar"]
    assert tensors[0][1].shape == (0, 3) and tensors[1][1].item() == 2.5


def test_non_contiguous_and_oddly_offset_tensors_arrive_intact() -> None:
    base = torch.randn(64, 48)
    half = torch.randn(1001).to(torch.float16)
    sent = [
        ("transposed", base.t()),
        ("odd_slice", half[1:]),  # storage offset of 2 bytes
        ("param", torch.nn.Parameter(torch.randn(5, 5).to(torch.bfloat16))),
        ("ids", torch.arange(-7, 100, dtype=torch.int64).view(-1, 1)),
    ]

    def trainer(group: SyncGroup) -> None:
        WeightSender(group, bucket_bytes=4096).send(iter(sent), version=3)

    _, (version, tensors) = pair(trainer, lambda g: WeightReceiver(g).receive(timeout_s=5))
    assert version == 3
    for (name, want), (got_name, got) in zip(sent, tensors, strict=True):
        assert name == got_name and same_bits(got, want.detach().contiguous())


def test_stalled_sender_raises_within_the_receive_timeout_and_breaks_the_group() -> None:
    def trainer(group: SyncGroup) -> None:
        time.sleep(1.5)  # alive but silent

    def generator(group: SyncGroup) -> tuple[float, str, str]:
        receiver = WeightReceiver(group)
        started = time.monotonic()
        with pytest.raises(WeightSyncError) as first:
            receiver.receive(timeout_s=0.5)
        elapsed = time.monotonic() - started
        with pytest.raises(WeightSyncError) as second:
            receiver.receive(timeout_s=0.5)
        return elapsed, str(first.value), str(second.value)

    _, (elapsed, first, second) = pair(trainer, generator)
    assert 0.4 < elapsed < 1.4
    assert "rank 1 of 2" in first and "unusable" in first
    assert "broken by an earlier failure" in second


def test_garbage_header_breaks_the_group() -> None:
    def trainer(group: SyncGroup) -> None:
        group.broadcast(torch.arange(8, dtype=torch.int64))

    def generator(group: SyncGroup) -> str | None:
        with pytest.raises(WeightSyncError, match="different scalerl versions"):
            WeightReceiver(group).receive(timeout_s=5)
        return group.broken

    _, broken = pair(trainer, generator)
    assert broken is not None and "magic" in broken


BAD_LAYOUTS = {
    "unreadable": b"\xc1 not msgpack",
    "wrong: bad entry": msgpack.packb(
        {"tensors": [["w", "float32", [300], 0, 999]], "checksums": [[0] * 3]}
    ),
    "wrong: bad entry ": msgpack.packb(
        {"tensors": [["w", "float32", [2], "0", 8]], "checksums": [[0] * 3]}
    ),
    "unreadable ": msgpack.packb({"tensors": [["w", ["x"], [2], 0, 8]], "checksums": [[0] * 3]}),
    "inconsistent": msgpack.packb({"tensors": [], "checksums": []}),
}


@pytest.mark.parametrize("problem", BAD_LAYOUTS)
def test_bad_layout_is_rejected_but_the_next_version_arrives(problem: str) -> None:
    def trainer(group: SyncGroup) -> None:
        blob = BAD_LAYOUTS[problem]
        header = _Header(5, 1, 1024, 1, len(blob), 1024).encode()
        group.broadcast(torch.tensor(header, dtype=torch.int64))
        group.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        group.broadcast(torch.zeros(1024, dtype=torch.uint8))
        WeightSender(group, bucket_bytes=1024).send([("w", torch.ones(300))], version=6)

    def generator(group: SyncGroup) -> tuple[str, int]:
        receiver = WeightReceiver(group)
        with pytest.raises(WeightSyncError) as caught:
            receiver.receive(timeout_s=5)
        version, _ = receiver.receive(timeout_s=5)
        return str(caught.value), version

    _, (message, version) = pair(trainer, generator)
    assert f"layout of version 5 is {problem.strip()}" in message and version == 6


def test_kept_buffer_is_reused_only_after_the_old_tensors_are_dropped() -> None:
    def trainer(group: SyncGroup) -> None:
        sender = WeightSender(group, bucket_bytes=2048)
        for version in range(3):
            sender.send([("w", torch.full((1000,), float(version)))], version=version)

    def generator(group: SyncGroup) -> tuple[bool, bool]:
        receiver = WeightReceiver(group, keep_buffer=True)
        _, held = receiver.receive(timeout_s=5)
        _, second = receiver.receive(timeout_s=5)  # `held` is alive: needs a new buffer
        untouched = bool((held[0][1] == 0).all()) and bool((second[0][1] == 1).all())
        address = second[0][1].data_ptr()
        del held, second
        _, third = receiver.receive(timeout_s=5)
        return untouched, third[0][1].data_ptr() == address and bool((third[0][1] == 2).all())

    _, (untouched, reused) = pair(trainer, generator)
    assert untouched and reused


def test_sender_refuses_bad_input_before_sending_anything() -> None:
    with connect("127.0.0.1", free_port(), 1, 0, timeout_s=5) as group:
        sender = WeightSender(group, bucket_bytes=1000)
        assert sender.bucket_bytes == 512  # rounded down to whole checksum rows
        with pytest.raises(InputError, match="appears twice"):
            sender.send([("a", torch.zeros(2)), ("a", torch.zeros(2))], version=1)
        with pytest.raises(InputError, match="complex64"):
            sender.send([("c", torch.zeros(2, dtype=torch.complex64))], version=1)
        with pytest.raises(InputError, match="receivers have rank >= 1"):
            WeightReceiver(group)
        with pytest.raises(InputError, match="at least 512"):
            WeightSender(group, bucket_bytes=100)
        assert sender.send([("a", torch.zeros(2))], version=2).buckets == 1  # group still fine


def test_layout_lists_what_the_module_doc_says() -> None:
    captured: list[torch.Tensor] = []

    def trainer(group: SyncGroup) -> None:
        WeightSender(group, bucket_bytes=1024).send([("w", torch.ones(300))], version=9)

    def generator(group: SyncGroup) -> None:
        header = torch.empty(8, dtype=torch.int64)
        group.broadcast(header)
        layout = torch.empty(int(header[6]), dtype=torch.uint8)
        group.broadcast(layout)
        for size in (1024, 176):
            group.broadcast(torch.empty(size, dtype=torch.uint8))
        captured.extend([header, layout])

    pair(trainer, generator)
    header, layout = captured
    assert header.tolist()[2:] == [9, 1, 1200, 2, layout.numel(), 1024]
    body = msgpack.unpackb(layout.numpy().tobytes())
    assert body["tensors"] == [["w", "float32", [300], 0, 1200]]
    assert [c[0] for c in body["checksums"]] == [1024, 176]


class Gathered:
    """Like a sharded policy's gathered weights: every pass makes each tensor afresh, one at a
    time, and counts how many of them are alive at once."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes, self.alive, self.most_alive, self.passes = sizes, 0, 0, 0

    def __iter__(self) -> Any:
        self.passes += 1
        for i, size in enumerate(self.sizes):
            tensor = torch.arange(size, dtype=torch.float32) + i
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
            weakref.finalize(tensor, self._died)
            yield f"w{i}", tensor
            del tensor

    def _died(self) -> None:
        self.alive -= 1


def test_the_sender_holds_one_gathered_tensor_at_a_time() -> None:
    # Tensors smaller than a bucket, larger than one, and one exactly a bucket long.
    gathered = Gathered([100, 3000, 256, 1, 700, 2048])

    def trainer(group: SyncGroup) -> int:
        return WeightSender(group, bucket_bytes=2048).send(gathered, version=4).buckets

    buckets, (version, tensors) = pair(trainer, lambda g: WeightReceiver(g).receive(timeout_s=5))
    assert version == 4 and buckets > len(gathered.sizes)
    assert gathered.passes == 2  # layout and checksums, then the send
    # The next tensor is made while the sender still holds the one before.
    assert gathered.most_alive <= 2
    for i, (name, tensor) in enumerate(tensors):
        assert name == f"w{i}"
        assert torch.equal(tensor, torch.arange(gathered.sizes[i], dtype=torch.float32) + i)


def test_weights_that_change_between_the_two_passes_are_refused() -> None:
    class Shifting(Gathered):
        def __iter__(self) -> Any:
            self.passes += 1
            yield "w", torch.zeros(10 * self.passes)

    def trainer(group: SyncGroup) -> None:
        WeightSender(group, bucket_bytes=1024).send(Shifting([]), version=1)

    def generator(group: SyncGroup) -> None:
        with pytest.raises(WeightSyncError):
            WeightReceiver(group).receive(timeout_s=2)

    with pytest.raises(InputError, match="changed between the sender's two passes"):
        pair(trainer, generator)
