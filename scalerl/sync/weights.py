"""Versioned weight broadcast: the trainer's `WeightSender` and each generator's `WeightReceiver`.

Wire format, version 1. One policy version is this sequence of broadcasts from rank 0:

1. header: int64[8] = [MAGIC, FORMAT, policy version, number of tensors, payload bytes,
   number of buckets, layout bytes, bucket bytes].
2. layout: uint8[layout bytes] holding msgpack
   `{"tensors": [[name, dtype, shape, offset, nbytes], ...], "checksums": [[nbytes, s1, s2], ...]}`
   with one checksum per bucket.
3. payload: one uint8 broadcast per bucket. The payload is a virtual flat byte string in which
   every tensor starts at a multiple of ALIGN (512) bytes, the gaps being zero; bucket i is bytes
   [i * B, min((i + 1) * B, total)) of it, B = bucket bytes. So several small tensors share a
   bucket and a big tensor spans several.

Checksum of a byte range: read it as rows of 64 int64 words (the last row zero-padded); s1 is the
sum of all words and s2 the sum of (row index + 1) * row sum, both modulo 2**64. Integer sums wrap
the same way on every device and in every order, so the sender (on its tensors, piece by piece,
without packing) and the receiver (on the received bucket) agree bit for bit, and no bucket is
copied to the host. s2 makes the checksum depend on position, so bytes landing at the wrong offset
are caught, not only flipped bits. Tensors start on row boundaries so each piece's rows are rows
of its bucket.

A receiver returns a version only when every bucket arrived and matched; otherwise it raises
`WeightSyncError` and the caller keeps its previous weights. After a checksum or layout problem it
still takes part in every remaining broadcast of that version, so the group stays usable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import astuple, dataclass
from typing import Any

import msgpack
import torch
from torch import Tensor

from scalerl.errors import InputError, WeightSyncError
from scalerl.sync.group import SyncGroup

MAGIC = 0x53524C5753594E43  # "SRLWSYNC"
FORMAT = 1
HEADER_LEN = 8
ALIGN = 512
_ROW_WORDS = ALIGN // 8
_MASK = (1 << 64) - 1
_MAX_LAYOUT_BYTES = 1 << 30

_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in "float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool "
    "float8_e4m3fn float8_e5m2".split()
}


@dataclass(frozen=True)
class SendStats:
    """What one `WeightSender.send` moved: payload bytes, bucket count, wall seconds."""

    version: int
    bytes: int
    buckets: int
    seconds: float


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lives in the flat payload."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class _Piece:
    """The part of tensor `slot` that falls into one bucket."""

    slot: int
    start: int  # first byte within the tensor
    length: int
    at: int  # first byte within the bucket


@dataclass(frozen=True)
class _Layout:
    slots: list[_Slot]
    total: int
    bucket_bytes: int

    @property
    def buckets(self) -> int:
        return math.ceil(self.total / self.bucket_bytes)

    def bucket_range(self, index: int) -> tuple[int, int]:
        low = index * self.bucket_bytes
        return low, min(low + self.bucket_bytes, self.total)


@dataclass(frozen=True)
class _Header:
    version: int
    tensors: int
    total: int
    buckets: int
    layout_bytes: int
    bucket_bytes: int

    def encode(self) -> list[int]:
        return [MAGIC, FORMAT, *astuple(self)]  # the field order is the wire order

    @staticmethod
    def decode(values: list[int]) -> _Header:
        magic, fmt, *fields = values
        if magic != MAGIC or fmt != FORMAT:
            raise WeightSyncError(
                f"weight header has magic {magic:#x} format {fmt}, expected {MAGIC:#x} format "
                f"{FORMAT}: sender and receiver run different scalerl versions"
            )
        header = _Header(*fields)
        sane = (
            header.tensors >= 0
            and header.total >= 0
            and header.bucket_bytes > 0
            and header.bucket_bytes % ALIGN == 0
            and header.buckets == math.ceil(header.total / header.bucket_bytes)
            and 0 < header.layout_bytes <= _MAX_LAYOUT_BYTES
        )
        if not sane:
            raise WeightSyncError(f"weight header is inconsistent: {header}")
        return header


class WeightSender:
    """Rank 0 of the sync group: broadcasts named tensors as one version (see module doc)."""

    def __init__(self, group: SyncGroup, bucket_bytes: int = 256 << 20) -> None:
        if group.rank != 0:
            raise InputError(f"the weight sender must be rank 0, this is rank {group.rank}")
        if bucket_bytes < ALIGN:
            raise InputError(f"bucket_bytes must be at least {ALIGN}, got {bucket_bytes}")
        self.group = group
        # Buckets start on checksum rows; rounding down keeps every bucket <= what was asked.
        self.bucket_bytes = bucket_bytes // ALIGN * ALIGN
        self._scratch = torch.empty(0, dtype=torch.uint8, device=group.device)

    def send(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> SendStats:
        """Broadcast one version; returns when every bucket left this rank.

        A re-iterable `named_tensors` (a list, or `scalerl.trainer.shard.GatheredWeights`, which
        gathers sharded weights afresh on each pass) is read twice: once for the layout and the
        bucket checksums, once to pack and send. So this rank holds no more than one of its
        tensors and one bucket at a time. A one-shot iterator is first read into a list."""
        started = time.perf_counter()
        if isinstance(named_tensors, Iterator):
            named_tensors = list(named_tensors)
        layout, checksums = _survey(named_tensors, self.bucket_bytes, self.group.device)
        blob = msgpack.packb(
            {
                "tensors": [
                    [s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in layout.slots
                ],
                "checksums": checksums,
            }
        )
        header = _Header(
            version, len(layout.slots), layout.total, layout.buckets, len(blob), self.bucket_bytes
        )
        device = self.group.device
        self.group.broadcast(torch.tensor(header.encode(), dtype=torch.int64, device=device))
        self.group.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device))
        self._send_buckets(named_tensors, layout)
        return SendStats(version, layout.total, layout.buckets, time.perf_counter() - started)

    def _send_buckets(self, named: Iterable[tuple[str, Tensor]], layout: _Layout) -> None:
        """The second pass: every bucket in order (see `_BucketWriter`)."""
        buckets = _BucketWriter(self, layout)
        count = 0
        for count, (name, tensor) in enumerate(named, start=1):
            slot = _same_slot(layout, count - 1, name, tensor)
            data = _as_bytes(tensor)
            for index, first, last in _bucket_spans(slot, layout.bucket_bytes):
                buckets.put(index, first, last, data[first - slot.offset : last - slot.offset])
        buckets.flush()
        if count != len(layout.slots) or buckets.sent != layout.buckets:
            raise InputError(
                f"the weights changed between the sender's two passes: {count} tensors in "
                f"{buckets.sent} buckets, the layout has {len(layout.slots)} in {layout.buckets}"
            )

    def _scratch_for(self, nbytes: int) -> Tensor:
        """The packing buffer, at most one bucket, kept between versions (packing into freshly
        allocated host memory costs more than the copy itself)."""
        if self._scratch.numel() < nbytes:
            self._scratch = torch.empty(0, dtype=torch.uint8, device=self.group.device)
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)
        return self._scratch

    def _broadcast_bucket(self, index: int, data: Tensor) -> None:
        """Send bucket `index`. Tests override this to damage or interrupt a transfer; `data`
        may be a view of the caller's tensor, so an override must not write into it."""
        self.group.broadcast(data)


class _BucketWriter:
    """The sender's buckets, in order, from the pieces of its tensors: each piece is copied into
    the bucket it falls in (packed in the sender's scratch buffer, sent once the next bucket
    begins), or sent as it is where it is a whole bucket already on the device."""

    def __init__(self, sender: WeightSender, layout: _Layout) -> None:
        self.sender = sender
        self.layout = layout
        self.scratch = sender._scratch
        self.packing: int | None = None  # the bucket being packed in the scratch buffer
        self.filled = 0  # bytes of it written so far (the gaps between tensors are zeroed)
        self.sent = 0  # buckets broadcast

    def put(self, index: int, first: int, last: int, piece: Tensor) -> None:
        """`piece`: payload bytes [first, last), which lie in bucket `index`."""
        low, high = self.layout.bucket_range(index)
        if self.packing != index:
            self.flush()
        if (first, last) == (low, high) and piece.device == self.sender.group.device:
            self.sender._broadcast_bucket(index, piece)
            self.sent += 1
            return
        if self.packing is None:
            self.scratch = self.sender._scratch_for(
                min(self.sender.bucket_bytes, self.layout.total)
            )
            self.packing, self.filled = index, 0
        self.scratch[self.filled : first - low].zero_()
        self.scratch[first - low : last - low].copy_(piece)
        self.filled = last - low

    def flush(self) -> None:
        """Send the bucket being packed, if any, its bytes after the last piece zeroed."""
        if self.packing is None:
            return
        low, high = self.layout.bucket_range(self.packing)
        self.scratch[self.filled : high - low].zero_()
        self.sender._broadcast_bucket(self.packing, self.scratch[: high - low])
        self.packing = None
        self.sent += 1


class WeightReceiver:
    """A generator's end: receives whole versions, or raises and returns nothing.

    `keep_buffer=True` keeps the payload buffer after a version and reuses it for the next one
    once every tensor of the previous version has been dropped (checked, never assumed). That
    saves allocating and first-touching a whole model per version on CPU, at the price of one
    payload of memory held between versions; GPUs get the same from the caching allocator.
    """

    def __init__(self, group: SyncGroup, *, keep_buffer: bool = False) -> None:
        if group.rank == 0:
            raise InputError("rank 0 of the sync group is the sender; receivers have rank >= 1")
        self.group = group
        self.keep_buffer = keep_buffer
        self._spare: Tensor | None = None

    def receive(self, timeout_s: float | None = None) -> tuple[int, list[tuple[str, Tensor]]]:
        """Receive the next version: `(version, [(name, tensor), ...])` on the group's device.

        The tensors are views of one buffer holding exactly the payload. `timeout_s` bounds the
        whole call (default: each broadcast is bounded by the group's timeout). Raises
        WeightSyncError when anything is missing or damaged; the caller then keeps its weights.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        header = self._receive_header(deadline)
        raw = torch.empty(header.layout_bytes, dtype=torch.uint8, device=self.group.device)
        self.group.broadcast(raw, timeout_s=_remaining(deadline))
        problems: list[str] = []
        layout: _Layout | None = None
        checksums: list[tuple[int, int, int]] = []
        try:
            layout, checksums = _decode_layout(raw.cpu().numpy().tobytes(), header)
        except WeightSyncError as err:
            problems.append(str(err))
        flat = self._buffer(header.total)
        problems += self._receive_buckets(flat, header, checksums, deadline)
        if self.keep_buffer:
            self._spare = flat if flat._base is None else flat._base
        if problems or layout is None:
            raise WeightSyncError("; ".join(problems) + "; keeping the previous weights")
        return header.version, _views(flat, layout.slots)

    def _receive_buckets(
        self,
        flat: Tensor,
        header: _Header,
        checksums: list[tuple[int, int, int]],
        deadline: float | None,
    ) -> list[str]:
        """Fill `flat` bucket by bucket; checks each against `checksums` (none: unchecked)."""
        problems = []
        for index in range(header.buckets):
            low = index * header.bucket_bytes
            bucket = flat[low : min(low + header.bucket_bytes, header.total)]
            # Every bucket is received even after a problem, so the sender's broadcasts pair up.
            self.group.broadcast(bucket, timeout_s=_remaining(deadline))
            if not checksums:
                continue
            whole = [_Piece(0, 0, bucket.numel(), 0)]
            got = _checksum(whole, [bucket], bucket.numel(), self.group.device)
            if got != checksums[index]:
                problems.append(
                    f"bucket {index} (of {header.buckets}) of version {header.version}: "
                    f"checksum mismatch, expected {checksums[index]}, got {got}"
                )
        return problems

    def _buffer(self, nbytes: int) -> Tensor:
        spare, self._spare = self._spare, None
        if spare is not None and spare.numel() >= nbytes and _sole_owner(spare):
            return spare[:nbytes]
        del spare  # freed before the new one is allocated: never two payloads at once
        return torch.empty(nbytes, dtype=torch.uint8, device=self.group.device)

    def _receive_header(self, deadline: float | None) -> _Header:
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.group.device)
        self.group.broadcast(header, timeout_s=_remaining(deadline))
        try:
            return _Header.decode(header.tolist())
        except WeightSyncError as err:
            # Without a trusted header we cannot tell how many broadcasts follow.
            self.group.mark_broken(str(err))
            raise


def _survey(
    named: Iterable[tuple[str, Tensor]], bucket_bytes: int, device: torch.device
) -> tuple[_Layout, list[tuple[int, int, int]]]:
    """The first pass: every tensor's place in the payload and each bucket's checksum, computed
    piece by piece from the tensors (checksums add up over pieces, see `_checksum`). Everything
    is checked before a single byte is sent; no tensor is kept."""
    slots: list[_Slot] = []
    seen: set[str] = set()
    cursor = 0
    pieces: list[tuple[int, int]] = []  # (bucket, first row within it) of each row sum
    sums: list[Tensor] = []
    for name, tensor in named:
        if name in seen:
            raise InputError(f"tensor {name!r} appears twice in one weight version")
        seen.add(name)
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise InputError(f"tensor {name!r} has dtype {dtype}; supported: {sorted(_DTYPES)}")
        data = _as_bytes(tensor)
        slot = _Slot(name, dtype, tuple(tensor.shape), cursor, data.numel())
        for index, first, last in _bucket_spans(slot, bucket_bytes):
            pieces.append((index, (first - index * bucket_bytes) // ALIGN))
            sums.append(_row_sums(data[first - slot.offset : last - slot.offset]).to(device))
        slots.append(slot)
        cursor = _aligned(slot.end)
    layout = _Layout(slots, slots[-1].end if slots else 0, bucket_bytes)
    totals = [[0, 0] for _ in range(layout.buckets)]
    values = torch.stack(sums).tolist() if sums else []  # the only host transfer
    for (index, row), (p1, p2) in zip(pieces, values, strict=True):
        totals[index][0] += p1
        totals[index][1] += p2 + row * p1  # the piece's rows are shifted within the bucket
    checksums = []
    for index, (s1, s2) in enumerate(totals):
        low, high = layout.bucket_range(index)
        checksums.append((high - low, s1 & _MASK, s2 & _MASK))
    return layout, checksums


def _bucket_spans(slot: _Slot, bucket_bytes: int) -> Iterator[tuple[int, int, int]]:
    """`(bucket, first byte, end byte)` of each part of `slot` that falls in one bucket (payload
    offsets). Tensors start on ALIGN and buckets on multiples of it, so each part starts on a
    checksum row of its bucket."""
    if slot.nbytes == 0:
        return
    for index in range(slot.offset // bucket_bytes, (slot.end - 1) // bucket_bytes + 1):
        low = index * bucket_bytes
        yield index, max(slot.offset, low), min(slot.end, low + bucket_bytes)


def _same_slot(layout: _Layout, index: int, name: str, tensor: Tensor) -> _Slot:
    """The slot the first pass gave tensor number `index`, checked against the second pass."""
    slot = layout.slots[index] if index < len(layout.slots) else None
    dtype = str(tensor.dtype).removeprefix("torch.")
    if slot is None or (slot.name, slot.dtype, slot.shape) != (name, dtype, tuple(tensor.shape)):
        raise InputError(
            f"the weights changed between the sender's two passes: tensor {index} is "
            f"{name!r} {dtype} {tuple(tensor.shape)}, the layout says {slot}"
        )
    return slot


def _as_bytes(tensor: Tensor) -> Tensor:
    """A flat uint8 view of `tensor`; copies only a non-contiguous or oddly offset tensor."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if data.storage_offset() % 8:
        data = data.clone()  # checksum rows are read as int64 words
    return data


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _checksum(
    pieces: list[_Piece], sources: list[Tensor], nbytes: int, device: torch.device
) -> tuple[int, int, int]:
    """(bytes, s1, s2) of a bucket made of `pieces` of `sources` (module doc: the checksum)."""
    if not pieces:
        return (nbytes, 0, 0)
    sums = [_row_sums(sources[p.slot][p.start : p.start + p.length]) for p in pieces]
    values = torch.stack([s.to(device) for s in sums]).tolist()  # the only host transfer
    s1 = s2 = 0
    for piece, (p1, p2) in zip(pieces, values, strict=True):
        s1 += p1
        s2 += p2 + (piece.at // ALIGN) * p1  # the piece's rows are shifted within the bucket
    return (nbytes, s1 & _MASK, s2 & _MASK)


def _row_sums(data: Tensor) -> Tensor:
    """int64[2]: sum of the int64 words of `data` and the row-weighted sum, modulo 2**64."""
    full = data.numel() // ALIGN
    rows = data[: full * ALIGN].view(torch.int64).view(full, _ROW_WORDS).sum(dim=1)
    tail = data.numel() - full * ALIGN
    if tail:
        last = torch.zeros(ALIGN, dtype=torch.uint8, device=data.device)
        last[:tail] = data[full * ALIGN :]
        rows = torch.cat([rows, last.view(torch.int64).sum().reshape(1)])
    return torch.stack([rows.sum(), (rows * _row_weights(rows.numel(), data.device)).sum()])


_ROW_WEIGHTS: dict[torch.device, Tensor] = {}


def _row_weights(count: int, device: torch.device) -> Tensor:
    """1, 2, ..., count; cached because allocating it per bucket costs more than the sum."""
    cached = _ROW_WEIGHTS.get(device)
    if cached is None or cached.numel() < count:
        cached = torch.arange(1, max(count, 4096) + 1, dtype=torch.int64, device=device)
        _ROW_WEIGHTS[device] = cached
    return cached[:count]


def _decode_layout(blob: bytes, header: _Header) -> tuple[_Layout, list[tuple[int, int, int]]]:
    """The layout in `blob`, checked against the header; WeightSyncError for anything odd."""
    try:
        body: Any = msgpack.unpackb(blob)
        slots = [_Slot(n, d, tuple(shape), o, b) for n, d, shape, o, b in body["tensors"]]
        checksums = [(int(n), int(s1), int(s2)) for n, s1, s2 in body["checksums"]]
        problem = _layout_problem(slots, checksums, header)
    except Exception as err:  # malformed blobs raise msgpack, key, unpacking and type errors
        problem = f"unreadable ({type(err).__name__}: {err})"
    if problem:
        raise WeightSyncError(f"layout of version {header.version} is {problem}")
    return _Layout(slots, header.total, header.bucket_bytes), checksums


def _layout_problem(
    slots: list[_Slot], checksums: list[tuple[int, int, int]], header: _Header
) -> str | None:
    if len(slots) != header.tensors or len(checksums) != header.buckets:
        return (
            f"inconsistent: {len(slots)} tensors and {len(checksums)} checksums, "
            f"the header says {header.tensors} and {header.buckets}"
        )
    for slot in slots:
        dtype = _DTYPES.get(slot.dtype)
        ok = (
            dtype is not None
            and isinstance(slot.name, str)
            and all(isinstance(v, int) and v >= 0 for v in (*slot.shape, slot.offset, slot.nbytes))
            and slot.offset % ALIGN == 0
            and slot.end <= header.total
            and slot.nbytes == math.prod(slot.shape) * dtype.itemsize
        )
        if not ok:
            return f"wrong: bad entry {slot}"
    return None


def _views(flat: Tensor, slots: list[_Slot]) -> list[tuple[str, Tensor]]:
    return [(s.name, flat[s.offset : s.end].view(_DTYPES[s.dtype]).view(s.shape)) for s in slots]


def _sole_owner(tensor: Tensor) -> bool:
    """Whether nothing but `tensor` itself references its storage (no view of it survives)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    fresh = torch.empty(1, dtype=tensor.dtype, device=tensor.device)
    return bool(
        use_count(tensor.untyped_storage()._cdata) <= use_count(fresh.untyped_storage()._cdata)
    )


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)
