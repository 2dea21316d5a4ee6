"""Atomic training checkpoints: ``root/step-000123/`` holds everything needed to resume.

A checkpoint directory is itself an HF model directory (config, safetensors, tokenizer) that
`load_policy` or a generator can load, plus ``optimizer.pt``, ``scheduler.pt`` and ``state.json``
(plain state of the run: step, policy version, curriculum, history, counters).

Atomicity: everything is written into ``root/.tmp-step-000123-<random>/``, fsynced, and renamed to
``step-000123`` in one ``os.rename``; only directories named ``step-<digits>`` that hold
``state.json`` count as checkpoints, so a crash mid-save leaves a temp directory that is ignored
(and removed by the next save: one writer per root is assumed).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from scalerl.errors import DataError, InputError
from scalerl.trainer.policy import Policy

CHECKPOINT_NAME = re.compile(r"^step-(\d+)$")
TEMP_PREFIX = ".tmp-step-"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
STATE_FILE = "state.json"


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def save_checkpoint(
    root: Path,
    step: int,
    *,
    policy: Policy,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically under ``root``, keep the newest ``keep``; return it.

    ``state`` must be JSON-serialisable; ``step`` is stored in it as well.
    """
    if keep < 1:
        raise InputError(f"checkpoints to keep must be >= 1; got {keep}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    temp = root / f"{TEMP_PREFIX}{step:06d}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    try:
        policy.save_pretrained(temp)
        torch.save(optimizer.state_dict(), temp / OPTIMIZER_FILE)
        torch.save(scheduler.state_dict(), temp / SCHEDULER_FILE)
        # state.json last: its presence marks a complete checkpoint.
        (temp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
        _fsync_tree(temp)
        final = _publish(temp, root / checkpoint_name(step))
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _prune(root, keep)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = CHECKPOINT_NAME.match(entry.name)
        if match and entry.is_dir() and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def load_checkpoint(
    path: Path, *, policy: Policy, optimizer: Optimizer, scheduler: LRScheduler
) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler from checkpoint ``path``; return its state dict."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise DataError(f"checkpoint {path} is missing or incomplete (no {STATE_FILE})")
    try:
        state = json.loads((path / STATE_FILE).read_text())
        optimizer_state = torch.load(
            path / OPTIMIZER_FILE, map_location=policy.device, weights_only=True
        )
        scheduler_state = torch.load(path / SCHEDULER_FILE, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise DataError(f"cannot read checkpoint {path}: {err}") from err
    policy.load_weights(path)
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    return dict(state)


def _publish(temp: Path, final: Path) -> Path:
    """Rename ``temp`` to ``final``; an existing ``final`` (same step re-saved) is replaced."""
    displaced = None
    if final.exists():
        displaced = final.with_name(f"{TEMP_PREFIX}old-{uuid.uuid4().hex[:8]}")
        os.rename(final, displaced)
    os.rename(temp, final)
    _fsync_dir(final.parent)
    if displaced is not None:
        shutil.rmtree(displaced, ignore_errors=True)
    return final


def _prune(root: Path, keep: int) -> None:
    for _, path in list_checkpoints(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers(root: Path) -> None:
    """Temp directories of saves that crashed (one writer per root, so none is in progress)."""
    for entry in root.iterdir():
        if entry.name.startswith(TEMP_PREFIX) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for sub in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
        _fsync_dir(sub)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
