"""Atomic training checkpoints: ``root/step-000123/`` holds everything needed to resume.

A checkpoint directory is itself an HF model directory (config, safetensors, tokenizer) that
`load_policy` or a generator can load, plus ``optimizer/`` (torch.distributed.checkpoint: each
trainer rank writes its own shards, and any number of ranks can read them back), ``scheduler.pt``
and ``state.json`` (plain state of the run: step, policy version, curriculum, history, counters).
With sharded ranks, rank 0 writes the HF weights, gathered one tensor at a time.

Atomicity: everything is written into ``root/.tmp-step-000123-<random>/``, fsynced, and renamed to
``step-000123`` in one ``os.rename``; only directories named ``step-<digits>`` that hold
``state.json`` count as checkpoints, so a crash mid-save leaves a temp directory that is ignored
(and removed by the next save: one writer per root is assumed).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from scalerl.errors import DataError, InputError
from scalerl.trainer.policy import Policy
from scalerl.trainer.shard import Ranks, full_weights, is_sharded

CHECKPOINT_NAME = re.compile(r"^step-(\d+)$")
TEMP_PREFIX = ".tmp-step-"
OPTIMIZER_DIR = "optimizer"
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
    ranks: Ranks | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically under ``root``, keep the newest ``keep``; return it.

    ``state`` must be JSON-serialisable and, when it has a ``step``, agree with ``step``. With
    several trainer ranks, rank 0 calls this and the followers join through `write_shared`.
    """
    ranks = ranks or Ranks()
    if keep < 1:
        raise InputError(f"checkpoints to keep must be >= 1; got {keep}")
    if state.get("step", step) != step:
        raise InputError(f"checkpoint of step {step} given the state of step {state['step']}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    temp = root / f"{TEMP_PREFIX}{step:06d}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    ranks.announce("checkpoint", str(temp))
    try:
        write_shared(temp, policy, optimizer)
        torch.save(scheduler.state_dict(), temp / SCHEDULER_FILE)
        # state.json last: its presence marks a complete checkpoint.
        (temp / STATE_FILE).write_text(json.dumps({"step": step} | state, indent=1))
        _fsync_tree(temp)
        final = _publish(temp, root / checkpoint_name(step))
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _prune(root, keep)
    return final


def write_shared(directory: Path, policy: Policy, optimizer: Optimizer) -> None:
    """What every rank writes (a collective): the weights and the optimizer's shards."""
    if is_sharded(policy):
        weights = dict(full_weights(policy, cast=False))
        if dist.get_rank() == 0:
            policy.save_pretrained(directory, weights=weights)
    else:
        policy.save_pretrained(directory)
    state = {"optimizer": get_optimizer_state_dict(policy.scorer, optimizer)}
    with _one_process_is_fine():
        dcp.save(state, checkpoint_id=directory / OPTIMIZER_DIR, no_dist=not dist.is_initialized())
    if dist.is_initialized():
        dist.barrier()  # every shard is on disk before rank 0 publishes


def load_optimizer(path: Path, policy: Policy, optimizer: Optimizer) -> None:
    """The optimizer's state from checkpoint ``path``, resharded for this policy's ranks."""
    state = {"optimizer": get_optimizer_state_dict(policy.scorer, optimizer)}
    try:
        with _one_process_is_fine():
            dcp.load(state, checkpoint_id=path / OPTIMIZER_DIR, no_dist=not dist.is_initialized())
    except (OSError, RuntimeError, ValueError, CheckpointException) as err:
        raise DataError(f"cannot read the optimizer state in checkpoint {path}: {err}") from err
    set_optimizer_state_dict(policy.scorer, optimizer, optim_state_dict=state["optimizer"])


@contextlib.contextmanager
def _one_process_is_fine() -> Iterator[None]:
    """A lone trainer reads and writes the same format without a process group; DCP warns
    about that on every call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


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
    path: Path,
    *,
    policy: Policy,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    weights: bool = True,
) -> dict[str, Any]:
    """Restore weights, optimizer and scheduler from checkpoint ``path``; return its state dict.

    A sharded policy has its weights loaded before it was sharded (`policy.load_weights`, then
    `shard_policy`): pass ``weights=False`` then.
    """
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise DataError(f"checkpoint {path} is missing or incomplete (no {STATE_FILE})")
    try:
        state = json.loads((path / STATE_FILE).read_text())
        scheduler_state = torch.load(path / SCHEDULER_FILE, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise DataError(f"cannot read checkpoint {path}: {err}") from err
    if weights:
        policy.load_weights(path)
    load_optimizer(path, policy, optimizer)
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
