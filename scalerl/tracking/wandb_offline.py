"""What earlier attempts of a run left in W&B's offline files: the last step each holds.

W&B buffers a run's records and writes its `.wandb` file every
`x_transaction_log_flush_interval` seconds (15 by default), so a process killed mid-run leaves
the last seconds unwritten although `log` had taken them. A resumed trainer asks this module
what is really on disk and sends the rest again. The file is a LevelDB-style log: a 7-byte
header, then 32 KiB blocks of chunks (CRC (4 bytes), length (2, little-endian), type (1: whole,
2: first, 3: middle, 4: last), data), each record a `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
WHOLE, FIRST, LAST = 1, 2, 4


def records(data: bytes) -> Iterator[bytes]:
    """The records' bytes, up to the first chunk cut short (a killed writer's tail)."""
    pending, pos = b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header: padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if kind == 0 or pos + HEADER + length > len(data):
            return
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        pending = chunk if kind in (WHOLE, FIRST) else pending + chunk
        if kind in (WHOLE, LAST):
            yield pending


def offline_folders(run_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of W&B run `run_id` under `run_dir`, oldest first. W&B names each
    `offline-run-<YYYYmmdd_HHMMSS>-<id>`, and a second attempt started within the same second
    `...-<id>-1` (then -2, ...): those count too. Another run's folder (`<id>-fit`) does not."""
    name = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for folder in (run_dir / "wandb").glob("offline-run-*"):
        if match := name.fullmatch(folder.name):
            found.append((match.group(1), int(match.group(2) or 0), folder))
    return [folder for _, _, folder in sorted(found)]


def last_step(run_dir: Path, run_id: str) -> int:
    """The highest history step in the offline files of W&B run `run_id` under `run_dir`
    (-1: none)."""
    from wandb.proto import wandb_internal_pb2 as pb

    last = -1
    for folder in offline_folders(run_dir, run_id):
        path = folder / f"run-{run_id}.wandb"
        if not path.is_file():
            continue
        for data in records(path.read_bytes()):
            record = pb.Record()  # type: ignore[attr-defined]  # chosen by protobuf version
            try:
                record.ParseFromString(data)
            except Exception:  # noqa: BLE001 — a damaged record ends what can be read
                break
            if record.WhichOneof("record_type") == "history":
                last = max(last, record.history.step.num)
    return last
