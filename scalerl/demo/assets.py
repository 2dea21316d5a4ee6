"""The demo's assets — task data and the warmed-up base model — built once and cached.

`prepare_demo(cache_dir)` returns paths to `train.jsonl`, `val.jsonl` and an HF model directory.
The first call builds them (~30 s on 2 idle cores: a random tiny Llama, then the supervised
warm-up); later calls with the same parameters find them under `cache_dir/demo-<hash>` and return
at once. The hash covers every parameter and `ASSETS_VERSION`, so a change to either builds afresh
beside the old copy instead of reusing a stale one.

Safe for concurrent callers: each builds in a private temporary directory and renames it into
place; a rename is atomic, so a cache entry is either complete or absent. If two processes race,
the loser discards its copy and uses the winner's (both are identical: the build is seeded).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.demo.task import TRAIN_FILE, VALIDATION_FILE, ReverseTask, read_jsonl, write_task
from scalerl.demo.warmup import WarmupConfig, warm_up
from scalerl.errors import DataError

log = logging.getLogger(__name__)

# Bump when the build's code changes what it produces, so stale caches are not reused.
ASSETS_VERSION = 1
MODEL_DIR = "model"
MANIFEST = "manifest.json"
SCRATCH_PREFIX = ".building-"
# A build takes well under a minute on idle cores; scratch this old belongs to a killed build.
ABANDONED_AFTER_SECONDS = 3600.0


@dataclass(frozen=True)
class DemoAssets:
    model_path: Path
    train_path: Path
    validation_path: Path


@dataclass(frozen=True)
class DemoParams:
    """Everything the assets depend on; its hash names the cache entry."""

    task: ReverseTask = field(default_factory=ReverseTask)
    train: int = 4000
    validation: int = 256
    seed: int = 0
    shape: TinyModelShape = field(default_factory=TinyModelShape)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)

    def key(self) -> str:
        blob = json.dumps({"version": ASSETS_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _assets(entry: Path) -> DemoAssets:
    return DemoAssets(entry / MODEL_DIR, entry / TRAIN_FILE, entry / VALIDATION_FILE)


def _build(directory: Path, params: DemoParams) -> dict[str, object]:
    """Write data and the warmed-up model into `directory`; return facts for the manifest."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = write_task(
        directory,
        train=params.train,
        validation=params.validation,
        seed=params.seed,
        task=params.task,
    )
    model_path = build_random_model(
        directory / MODEL_DIR, shape=params.shape, dtype=torch.float32, seed=params.seed
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    # Only training prompts: the validation split must stay unseen for pass rate to mean anything.
    result = warm_up(
        model, tokenizer, read_jsonl(files.train_path), params.task.alphabet, params.warmup
    )
    model.save_pretrained(str(model_path), safe_serialization=True)
    tokenizer.save_pretrained(str(model_path))
    return {
        "warmup_seconds": round(result.seconds, 2),
        "warmup_final_loss": round(sum(result.losses[-20:]) / len(result.losses[-20:]), 4),
    }


def default_cache_dir() -> Path:
    """Where built assets live: $SCALERL_CACHE, else ~/.cache/scalerl (shared by `make demo`,
    the tests and every local run)."""
    return Path(os.environ.get("SCALERL_CACHE") or Path.home() / ".cache" / "scalerl")


def _sweep_abandoned(cache_dir: Path) -> None:
    """Remove scratch directories of builds that were killed (older than any live build)."""
    cutoff = time.time() - ABANDONED_AFTER_SECONDS
    for scratch in cache_dir.glob(f"{SCRATCH_PREFIX}*"):
        try:
            if scratch.stat().st_mtime < cutoff:
                shutil.rmtree(scratch, ignore_errors=True)
        except OSError:
            pass  # another caller swept it first


def prepare_demo(cache_dir: Path, params: DemoParams = DemoParams()) -> DemoAssets:
    """The demo's data and base model for `params`, built under `cache_dir` on first use."""
    cache_dir = Path(cache_dir)
    entry = cache_dir / f"demo-{params.key()}"
    if (entry / MANIFEST).is_file():
        return _assets(entry)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(cache_dir)
    log.info("building demo assets in %s (first use; about half a minute)", entry)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=cache_dir))
    try:
        facts = _build(scratch, params)
        manifest = {"version": ASSETS_VERSION, "params": asdict(params), **facts}
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.rename(scratch, entry)
        except OSError:
            # Another process finished first (the entry exists and is not empty): use its copy.
            if not (entry / MANIFEST).is_file():
                raise
    except OSError as err:
        raise DataError(f"cannot build the demo assets in {cache_dir}: {err}") from err
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _assets(entry)
