"""LoRA on the trainer (`spec.model.lora`): PEFT's adapter layers on the frozen policy.

The base weights stay as loaded (frozen, in the body's dtype); PEFT keeps the adapter's A and B
in float32 (its default for adapters on a lower-precision base), so the optimizer's state is
float32 too. The FP32 LM head is never adapted: the generators apply their own FP32 head to
the same base head. PEFT injects its layers into the model in place, so the policy's forward
(`Scorer`) runs through them unchanged; what changes is what the policy sends, saves and loads:
the adapter alone (`adapter_weights`, `save_adapter`, `load_adapter`), as a PEFT adapter folder
(adapter_config.json + adapter_model.safetensors) that PEFT and vLLM both load.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from scalerl.errors import DataError, InputError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

    from scalerl.spec import LoraSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def decoder_linear_names(model: PreTrainedModel) -> list[str]:
    """The names (last part) of every linear layer inside the model's decoder blocks: its
    attention and MLP projections, whatever the architecture calls them. The embeddings and the
    LM head are outside the blocks, so they are never among them."""
    head = model.get_output_embeddings()
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not head and ".layers." in f".{name}":
            names.add(name.rsplit(".", 1)[-1])
    if not names:
        raise DataError(
            f"found no linear layers in the decoder blocks of {type(model).__name__}; name "
            "model.lora.targetModules"
        )
    return sorted(names)


def attach_adapter(model: PreTrainedModel, spec: LoraSpec, seed: int = 0) -> PeftModel:
    """Freeze `model` and inject a fresh LoRA adapter (B = 0: the policy is unchanged until it
    trains); returns PEFT's wrapper, which saves and loads the adapter. `model` itself, with the
    adapter layers in it, stays the one the trainer runs.

    A's random start is drawn from `seed` (the run's), not from the process's random state:
    every trainer rank must start from the same adapter before it keeps its shard of it, and a
    run started again draws the same one."""
    from peft import LoraConfig, get_peft_model  # late: only a LoRA run needs PEFT

    targets = list(spec.target_modules or decoder_linear_names(model))
    head_name = _module_name(model, model.get_output_embeddings())
    if head_name.rsplit(".", 1)[-1] in targets:
        raise InputError(
            f"model.lora.targetModules: {head_name!r} is the LM head, which is not adapted "
            "(the FP32 head stays as it is on both sides)"
        )
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
    )
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            wrapped = get_peft_model(model, config)
    except ValueError as err:  # PEFT: "Target modules {...} not found in the base model"
        raise DataError(f"model.lora.targetModules {targets}: {err}") from None
    _dropout_in_training(model, spec.dropout)
    return wrapped


def _dropout_in_training(model: nn.Module, dropout: float) -> None:
    """The policy runs in eval mode (trainer and engine compute the same function); an asked-for
    adapter dropout is the one exception, on the trainer's side only."""
    if dropout == 0:
        return
    for name, module in model.named_modules():
        if name.endswith("lora_dropout"):
            module.train()


def _module_name(model: nn.Module, target: nn.Module) -> str:
    return next((name for name, module in model.named_modules() if module is target), "")


def adapter_weights(wrapped: PeftModel) -> Iterator[tuple[str, Tensor]]:
    """The adapter's tensors by the names a saved adapter has (no adapter name inside), detached,
    float32: what a generator needs for a new version, and nothing of the base."""
    from peft import get_peft_model_state_dict

    for name, tensor in get_peft_model_state_dict(wrapped).items():
        yield name, tensor.detach()


def save_adapter(
    wrapped: PeftModel, directory: Path, weights: Mapping[str, Tensor] | None = None
) -> None:
    """A PEFT adapter folder in `directory`: PEFT's adapter_config.json and the tensors in
    adapter_model.safetensors, `weights` (a sharded adapter gathered whole,
    `scalerl.trainer.shard.full_weights`) or the adapter's own."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapped.peft_config[wrapped.active_adapter].save_pretrained(str(directory))
    tensors = dict(weights) if weights is not None else dict(adapter_weights(wrapped))
    contiguous = {name: tensor.contiguous() for name, tensor in tensors.items()}
    save_file(contiguous, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_adapter(wrapped: PeftModel, directory: Path) -> None:
    """Copy a saved adapter's weights from `directory` into the policy's adapter, in place;
    DataError when it is missing or is not this adapter (another rank or other layers)."""
    from peft import set_peft_model_state_dict

    path = directory / ADAPTER_WEIGHTS
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as err:
        raise DataError(f"cannot read the adapter in {directory}: {err}") from err
    expected = dict(adapter_weights(wrapped))
    wrong = sorted(
        name
        for name in expected.keys() | state.keys()
        if name not in state or name not in expected or state[name].shape != expected[name].shape
    )
    if wrong:
        raise DataError(
            f"the adapter in {directory} does not match model.lora (rank, targetModules): "
            f"{wrong[:5]} differ"
        )
    result: Any = set_peft_model_state_dict(wrapped, state)
    if getattr(result, "unexpected_keys", None):
        raise DataError(f"the adapter in {directory} has unknown tensors {result.unexpected_keys}")


def is_adapter(folder: Path) -> bool:
    """A LoRA checkpoint: the adapter alone (spec.model.lora), no model of its own."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def merged_model(base: Path, folder: Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """The base model with the adapter in `folder` merged into it (PEFT's merge): a plain HF
    model. Raises what loading raises (the caller names the folders)."""
    from peft import PeftModel  # late: only a LoRA checkpoint needs PEFT
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype, local_files_only=True)
    merged: PreTrainedModel = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    return merged
