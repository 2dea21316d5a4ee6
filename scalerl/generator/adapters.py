"""LoRA on the generators (`spec.model.lora`): the engine serves the base with one adapter slot,
and every policy version is a new adapter loaded into that slot in place.

Each version's adapter is a folder (adapter_config.json, adapter_model.safetensors) that vLLM
loads by path: the trainer's own PEFT folder in the colocated placement, one written from the
broadcast tensors in the disaggregated one (`write_adapter`, in the worker). It is loaded with
`load_inplace` into the one adapter id every request names, so requests in flight continue on
the new adapter, as they continue on new full weights. Folders live in a scratch directory in
memory (/dev/shm where there is one); the engine keeps the newest two.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.spec import LORA_RANKS, LoraSpec

if TYPE_CHECKING:
    from torch import Tensor
    from vllm.lora.request import LoRARequest

ADAPTER_NAME = "policy"
ADAPTER_ID = 1  # vLLM's adapter ids start at 1
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
KEEP = 2  # adapter folders kept: the one loaded and the one before it
SHM = Path("/dev/shm")


def served_rank(rank: int) -> int:
    """The smallest rank vLLM serves that holds an adapter of `rank`."""
    return next(r for r in LORA_RANKS if r >= rank)


def engine_args(lora: LoraSpec | None) -> dict[str, Any]:
    """vLLM's engine arguments for `lora` (none without it)."""
    if lora is None:
        return {}
    return {"enable_lora": True, "max_lora_rank": served_rank(lora.rank), "max_loras": 1}


def scratch_directory() -> Path:
    """A fresh directory for adapter folders, in memory where the machine has /dev/shm."""
    base = SHM if SHM.is_dir() else None
    return Path(tempfile.mkdtemp(prefix="scalerl-lora-", dir=base))


def version_folder(scratch: Path, version: int) -> Path:
    return scratch / f"v{version:08d}"


def prune(scratch: Path) -> None:
    """Keep the newest KEEP version folders."""
    for old in sorted(scratch.glob("v*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def adapter_request(folder: Path, *, reload: bool = False) -> LoRARequest:
    """The request for the adapter in `folder`; `reload` loads it into the slot in place (a
    new version), which requests must not carry: vLLM would reload it at every step."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(folder), load_inplace=reload)


def write_adapter(
    folder: Path, named: Iterable[tuple[str, Tensor]], lora: LoraSpec, base: str
) -> Path:
    """A received adapter as a folder vLLM loads: the tensors under their own (PEFT) names and
    the config vLLM reads (rank, alpha, the adapted layers: those the names hold)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.contiguous() for name, tensor in named}
    targets = sorted(
        {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors if ".lora_" in name}
    )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "bias": "none",
    }
    temp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    save_file(tensors, str(temp / ADAPTER_WEIGHTS))
    (temp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    temp.rename(folder)
    return folder
