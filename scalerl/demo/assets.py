"""The built-ins' assets — task data and the warmed-up base model — built once and cached.

`prepare_demo(cache_dir)` returns paths to `train.jsonl`, `val.jsonl` and an HF model directory;
`prepare_chat_arith(cache_dir)` to `train.parquet`, `validation.parquet` and its model. The first
call builds them (~30-60 s on 2 idle cores: a random tiny Llama, then the supervised warm-up);
later calls with the same parameters find them under `cache_dir/<name>-<hash>` and return at
once. The hash covers every parameter and the built-in's `VERSION`, so a change to either builds
afresh beside the old copy instead of reusing a stale one.

Safe for concurrent callers: each builds in a private temporary directory and renames it into
place; a rename is atomic, so a cache entry is either complete or absent. If two processes race,
the loser discards its copy and uses the winner's (both are identical: the build is seeded).

Resolving a built-in whose entry exists imports neither torch nor transformers (nor does this
module, or those it imports, at their top): only a build does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerl.demo import arith, bpe
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.demo.task import TRAIN_FILE, VALIDATION_FILE, ReverseTask, read_jsonl, write_task
from scalerl.demo.tokenizer import THINK_END
from scalerl.demo.warmup import Framing, WarmupConfig, warm_up
from scalerl.errors import DataError

log = logging.getLogger(__name__)

MODEL_DIR = "model"
MANIFEST = "manifest.json"
SCRATCH_PREFIX = ".building-"
# A build takes well under a minute on idle cores; scratch this old belongs to a killed build.
ABANDONED_AFTER_SECONDS = 3600.0


@dataclass(frozen=True)
class DemoAssets:
    """A built-in's base model directory and its data files."""

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

    # Bump when the build's code changes what it produces, so a stale cache entry is not reused.
    VERSION = 1

    def key(self) -> str:
        return _key(self)


# The chat-arith built-in: its warm-up leaves a held-out pass rate of ~0.2 (sampled at T=1).
ARITH_SHAPE = TinyModelShape(
    hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384, max_positions=96
)
ARITH_WARMUP = WarmupConfig(steps=600, batch=64, lr=3e-3, noise=0.5)


@dataclass(frozen=True)
class ChatArithParams:
    """Everything the chat-arith assets depend on; its hash names the cache entry."""

    task: arith.LargerTask = field(default_factory=arith.LargerTask)
    train: int = 3000
    validation: int = 256
    seed: int = 0
    merges: int = 64  # BPE merges learned from the task's text (fewer if the text has fewer)
    shape: TinyModelShape = ARITH_SHAPE
    warmup: WarmupConfig = ARITH_WARMUP

    VERSION = 2  # 2: asks for the larger number (addition did not warm up)

    def key(self) -> str:
        return _key(self)


# `builtin:chat-arith-25m`: the same task on a 25 M-parameter Llama (8 layers of 512), for
# benchmarks where a full weight update costs what it does on real models. Its warm-up takes
# ~8 minutes on 2 cores and leaves the same ~0.2 held-out pass rate.
CHAT_ARITH_25M = ChatArithParams(
    shape=TinyModelShape(
        hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, max_positions=96
    ),
    warmup=WarmupConfig(steps=400, batch=64, lr=1e-3, warmup_steps=5, noise=0.5),
)


def _key(params: Any) -> str:
    blob = json.dumps({"version": params.VERSION, **asdict(params)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _assets(entry: Path, train: str = TRAIN_FILE, validation: str = VALIDATION_FILE) -> DemoAssets:
    return DemoAssets(entry / MODEL_DIR, entry / train, entry / validation)


def _warm_and_save(
    model_path: Path,
    framing_for: Callable[[Any], Framing],
    examples: list[tuple[str, str]],
    alphabet: str,
    config: WarmupConfig,
) -> dict[str, object]:
    """Warm up the random model at `model_path` in place; return facts for the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    result = warm_up(model, framing_for(tokenizer), examples, alphabet, config)
    model.save_pretrained(str(model_path), safe_serialization=True)
    tokenizer.save_pretrained(str(model_path), save_jinja_files=False)
    return {
        "warmup_seconds": round(result.seconds, 2),
        "warmup_final_loss": round(sum(result.losses[-20:]) / len(result.losses[-20:]), 4),
    }


def _build(directory: Path, params: DemoParams) -> dict[str, object]:
    """Write the demo's data and warmed-up model into `directory`; return manifest facts."""
    files = write_task(
        directory,
        train=params.train,
        validation=params.validation,
        seed=params.seed,
        task=params.task,
    )
    model_path = build_random_model(directory / MODEL_DIR, shape=params.shape, seed=params.seed)
    # Only training prompts: the validation split must stay unseen for pass rate to mean anything.
    examples = [(row["prompt"], row["answer"]) for row in read_jsonl(files.train_path)]
    return _warm_and_save(
        model_path,
        lambda tokenizer: Framing(tokenizer, tokenizer.eos_token_id, think_end=THINK_END),
        examples,
        params.task.alphabet,
        params.warmup,
    )


def chat_arith_framing(tokenizer: Any) -> Framing:
    """How the chat-arith example runs the model: chat template, the task's system prompt, no
    thinking, the assistant's turn ended by `<|end|>`."""
    return Framing(
        tokenizer,
        bpe.end_ids(tokenizer)[0],
        think_end=None,
        chat_template=True,
        system_prompt=arith.SYSTEM_PROMPT,
    )


def _build_chat_arith(directory: Path, params: ChatArithParams) -> dict[str, object]:
    """Write chat-arith's Parquet data and warmed-up model into `directory`; return facts."""
    train_path, _ = arith.write_task(
        directory,
        train=params.train,
        validation=params.validation,
        seed=params.seed,
        task=params.task,
    )
    rows = arith.read_parquet(train_path)
    # The tokenizer learns its merges from training text only, like the model.
    texts = [
        arith.SYSTEM_PROMPT,
        *(r[arith.PROMPT_FIELD] + " " + r[arith.ANSWER_FIELD] for r in rows),
    ]
    tokenizer = bpe.build_tokenizer(texts, merges=params.merges)
    model_path = build_random_model(
        directory / MODEL_DIR,
        shape=params.shape,
        seed=params.seed,
        tokenizer=tokenizer,
        eos_ids=bpe.end_ids(tokenizer),
    )
    examples = [(r[arith.PROMPT_FIELD], r[arith.ANSWER_FIELD]) for r in rows]
    return _warm_and_save(model_path, chat_arith_framing, examples, arith.DIGITS, params.warmup)


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


def _cached(
    cache_dir: Path, name: str, params: Any, build: Callable[[Path], dict[str, object]]
) -> Path:
    """The cache entry `cache_dir/<name>-<hash of params>`, built by `build` on first use."""
    cache_dir = Path(cache_dir)
    entry = cache_dir / f"{name}-{params.key()}"
    if (entry / MANIFEST).is_file():
        return entry
    cache_dir.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(cache_dir)
    log.info("building %s assets in %s (first use; a minute or more)", name, entry)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=cache_dir))
    try:
        facts = build(scratch)
        manifest = {**facts, "version": params.VERSION, "params": asdict(params)}
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.rename(scratch, entry)
        except OSError:
            # Another process finished first (the entry exists and is not empty): use its copy.
            if not (entry / MANIFEST).is_file():
                raise
    except OSError as err:
        raise DataError(f"cannot build the {name} assets in {cache_dir}: {err}") from err
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return entry


def prepare_demo(cache_dir: Path, params: DemoParams = DemoParams()) -> DemoAssets:
    """The demo's data and base model for `params`, built under `cache_dir` on first use."""
    # `_build` is looked up at call time, so tests can wrap it.
    return _assets(_cached(cache_dir, "demo", params, lambda d: _build(d, params)))


def prepare_chat_arith(cache_dir: Path, params: ChatArithParams = ChatArithParams()) -> DemoAssets:
    """Chat-arith's Parquet data and base model for `params`, built under `cache_dir` on first
    use."""
    entry = _cached(cache_dir, "chat-arith", params, lambda d: _build_chat_arith(d, params))
    return _assets(entry, arith.TRAIN_FILE, arith.VALIDATION_FILE)
