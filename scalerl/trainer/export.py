"""`scalerl export CHECKPOINT OUT [--merge]`: a checkpoint as a model folder to serve or share.

A full fine-tuning checkpoint is already an HF model folder: export copies its model files
(config, weights, tokenizer) and leaves the run's state (optimizer, scheduler, state.json). A
LoRA checkpoint holds the adapter alone: export copies the adapter folder, or with `merge`
folds the adapter into its base (PEFT's merge) and writes the merged HF model, which any HF
loader or vLLM serves without LoRA.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from scalerl.errors import DataError, InputError
from scalerl.trainer.adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter, merged_model
from scalerl.trainer.checkpoint import OPTIMIZER_DIR, SCHEDULER_FILE, STATE_FILE
from scalerl.trainer.policy import LOAD_ERRORS, check_model_dir

RUN_STATE = {OPTIMIZER_DIR, SCHEDULER_FILE, STATE_FILE}


def export_checkpoint(
    checkpoint: Path, out: Path, *, merge: bool = False, base: Path | None = None
) -> str:
    """Write `checkpoint`'s model into `out` (a new or empty folder); returns what was written.

    `base` (LoRA with `merge`): the base model folder, if not the one the adapter names.
    Raises DataError for a checkpoint or base that cannot be read, InputError for an `out` that
    holds files or a `merge` of a full checkpoint.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    if not checkpoint.is_dir():
        raise DataError(f"checkpoint {checkpoint} is not a directory")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} is not empty; export writes into a new or empty folder")
    if not is_adapter(checkpoint):
        if merge:
            raise InputError(f"{checkpoint} is a full checkpoint (no adapter): nothing to merge")
        check_model_dir(checkpoint)
        _copy_model_files(checkpoint, out)
        return f"model (full fine-tuning) in {out}"
    if not merge:
        _copy_model_files(checkpoint, out)
        return f"LoRA adapter in {out} (PEFT format; --merge writes the merged model)"
    base_dir = base if base is not None else _adapter_base(checkpoint)
    _merge(checkpoint, check_model_dir(base_dir), out)
    return f"model (base {base_dir} with the adapter merged) in {out}"


def _copy_model_files(checkpoint: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for entry in checkpoint.iterdir():
        if entry.name in RUN_STATE or entry.is_dir():
            continue
        shutil.copy2(entry, out / entry.name)


def _adapter_base(checkpoint: Path) -> Path:
    """The base model the adapter was trained on, as its adapter_config.json names it."""
    try:
        config = json.loads((checkpoint / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read {checkpoint / ADAPTER_CONFIG}: {err}") from err
    named = config.get("base_model_name_or_path")
    if not named:
        raise DataError(f"{checkpoint / ADAPTER_CONFIG} names no base model: pass --base")
    return Path(named)


def _merge(checkpoint: Path, base: Path, out: Path) -> None:
    from transformers import AutoTokenizer  # late: heavy, and only this path needs it

    if not (checkpoint / ADAPTER_WEIGHTS).is_file():
        raise DataError(f"{checkpoint} has no {ADAPTER_WEIGHTS}")
    try:
        merged = merged_model(base, checkpoint)
        # A checkpoint carries the tokenizer; a bare adapter folder takes the base's.
        source = checkpoint if (checkpoint / "tokenizer_config.json").is_file() else base
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    except LOAD_ERRORS as err:
        raise DataError(f"cannot merge the adapter in {checkpoint} into {base}: {err}") from err
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
