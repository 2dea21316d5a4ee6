"""The policy being trained: an HF causal LM, its tokenizer and the FP32 LM head (paper: FP32 head).

With ``fp32_lm_head`` the final projection runs in float32 whatever the body dtype: the head's
parameter is kept in float32 (it is the master copy the optimizer updates), the body's last hidden
states are upcast and projected by the head in float32. The paper's ablation: asymptote 0.52 ->
0.61.
Generators get the head back in the checkpoint's dtype (`Policy.named_weights`) and apply their own
FP32 projection.

Supported: models whose logits are ``lm_head(final hidden state)`` (Llama, Mistral, Qwen2/3, ...).
Models that post-process logits (soft-capping, logit scale) are refused, since the trainer computes
the logits itself and would silently disagree with the generator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from scalerl.errors import DataError, InputError
from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters, filtered_logprobs
from scalerl.trainer import adapter

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from scalerl.spec import LoraSpec
    from scalerl.trainer.batch import Batch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Config fields of models whose logits are not plain lm_head(hidden); see the module docstring.
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")
LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, SafetensorError)
# Completion tokens whose logits are made at once (x vocabulary x 4 bytes of float32).
LOGIT_CHUNK = 2048
SAFETENSORS_INDEX = "model.safetensors.index.json"


class Policy:
    """A loaded model plus what the trainer needs around it. Build it with `load_policy`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype,
        fp32_lm_head: bool,
        temperature: float,
        path: Path,
        filters: SamplingFilters = NO_FILTERS,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = dtype  # the body's (and the checkpoint's) dtype
        self.fp32_lm_head = fp32_lm_head
        self.temperature = temperature
        self.filters = filters
        self.path = path
        self.scorer = Scorer(model, fp32_lm_head, temperature, filters)
        # With LoRA (`attach`): PEFT's wrapper of `model`, whose adapter is all that trains,
        # travels and is saved (scalerl.trainer.adapter).
        self.adapter: PeftModel | None = None

    def attach(self, lora: LoraSpec, seed: int = 0) -> None:
        """Freeze the policy and train a fresh LoRA adapter on it instead (drawn from `seed`)."""
        self.adapter = adapter.attach_adapter(self.model, lora, seed)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def head(self) -> nn.Linear:
        head = self.model.get_output_embeddings()
        assert isinstance(head, nn.Linear)
        return head

    @property
    def pad_id(self) -> int:
        """Token id used to pad batches (never trained on, so any valid id does)."""
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        return int(pad) if pad is not None else 0

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.model.parameters()

    def completion_logprobs(self, batch: Batch, packed: bool = False) -> tuple[Tensor, Tensor]:
        """``(logprobs, entropy)``, both float32 ``[samples, tokens]``, of the batch's completions.

        One forward over prompt + completion; ``packed`` runs the batch's sequences as one row
        without padding (attention kept within each sequence). Logits are divided by the
        sampling temperature and filtered by the sampling filters (top-p, top-k, min-p; each
        sampled token always kept: scalerl.recipe.sampling) before the softmax, so they match
        the generator's processed log-probs; entropy is of the same distribution and carries no
        gradient (a metric, not a loss term).
        """
        batch = batch.to(self.device)
        targets = batch.input_ids.gather(1, batch.completion_positions)
        scored: tuple[Tensor, Tensor] = self.scorer(
            batch.input_ids, batch.attention_mask, batch.completion_positions, targets, packed
        )
        return scored

    def named_weights(self, cast: bool = True) -> Iterator[tuple[str, Tensor]]:
        """HF-format ``(name, tensor)`` pairs to broadcast, detached, in the checkpoint's dtype.

        Names are those of the safetensors checkpoint: tied weights appear once, under the name
        HF saves them by, and non-persistent buffers (rotary tables) are left out. ``cast=False``
        keeps each tensor's own dtype (the FP32 head stays float32, as checkpoints store it).
        With LoRA: the adapter's tensors alone, by the names of a saved adapter.
        """
        if self.adapter is not None:
            for name, tensor in adapter.adapter_weights(self.adapter):
                yield name, tensor.to(self.dtype) if cast else tensor
            return
        seen: set[int] = set()
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            out = tensor.detach()
            if cast and out.is_floating_point() and out.dtype != self.dtype:
                out = out.to(self.dtype)  # the FP32 head goes out in the checkpoint's format
            yield name, out

    def save_pretrained(self, directory: Path, weights: dict[str, Tensor] | None = None) -> None:
        """Write the model (safetensors) and tokenizer to ``directory`` in HF format; a sharded
        policy passes its ``weights`` gathered whole (`scalerl.trainer.shard.full_weights`).

        The FP32 head is saved in float32 so a resumed run keeps its exact master copy;
        `load_policy` reads it back at full precision, and HF loaders simply cast it.
        With LoRA: the adapter folder (and the tokenizer), not the base.
        """
        if self.adapter is not None:
            self.save_adapter(directory, weights)
            self.tokenizer.save_pretrained(str(directory))
            return
        self.model.save_pretrained(str(directory), safe_serialization=True, state_dict=weights)
        self.tokenizer.save_pretrained(str(directory))

    def save_adapter(self, directory: Path, weights: dict[str, Tensor] | None = None) -> None:
        """LoRA: the adapter alone, as a PEFT adapter folder in ``directory``; a sharded
        policy passes its ``weights`` gathered whole, as for `save_pretrained`."""
        if self.adapter is None:
            raise InputError("the policy has no LoRA adapter to save")
        adapter.save_adapter(self.adapter, directory, weights)

    def load_weights(self, directory: Path) -> None:
        """Copy the weights saved in ``directory`` (safetensors) into this policy, in place
        (with LoRA: the adapter saved there)."""
        if self.adapter is not None:
            adapter.load_adapter(self.adapter, directory)
            return
        state = read_safetensors(directory)
        result = self.model.load_state_dict(state, strict=False)
        tied = set(_tied_names(self.model))
        missing = [key for key in result.missing_keys if key not in tied]
        if missing or result.unexpected_keys:
            raise DataError(
                f"checkpoint {directory} does not match the model: missing {missing[:5]}, "
                f"unexpected {result.unexpected_keys[:5]}"
            )
        # load_state_dict copies into the parameters as they are: an FP32 head stays FP32.

    def _restore_fp32_head(self, directory: Path) -> None:
        """Overwrite the FP32 head with the stored tensor when that one is float32 (exact resume);
        HF's loader would have rounded it to the body dtype."""
        if not self.fp32_lm_head:
            return
        state = read_safetensors(directory)
        name = head_parameter_name(self.model)
        stored = state.get(name)
        if stored is not None and stored.dtype == torch.float32:
            with torch.no_grad():
                self.head.weight.copy_(stored)


class Scorer(nn.Module):
    """The trainer's one forward: the body, then the head on the completion positions only.

    A module of its own so that, sharded (scalerl.trainer.shard), one forward gathers everything
    it touches: the decoder layers and an untied head are units of their own, this root owns the
    embeddings, the final norm and a tied head. The head is always called as a module, for the
    same reason; with the FP32 head its parameter and input are float32.

    The head's float32 logits (tokens x vocabulary) are the largest tensor of a step: they are
    made `LOGIT_CHUNK` tokens at a time and, when training on more than one chunk, recomputed in
    the backward pass instead of kept, so a long batch never holds them whole.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        fp32_lm_head: bool,
        temperature: float,
        filters: SamplingFilters = NO_FILTERS,
    ) -> None:
        super().__init__()
        self.model = model
        self.fp32_lm_head = fp32_lm_head
        self.temperature = temperature
        self.filters = filters

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        positions: Tensor,
        targets: Tensor,
        packed: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """float32 ``(logprobs, entropy)`` ``[samples, tokens]`` of ``targets``, the tokens at
        ``positions`` (right-padded rows; ``packed``: sequences packed into fewer rows)."""
        # The token at position p is predicted by the hidden state at p - 1.
        source = (positions - 1).clamp(min=0)
        if packed:
            picked = self._packed_hidden(input_ids, attention_mask, source)
        else:
            hidden = self.model.base_model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
            index = source.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            picked = hidden.gather(1, index)
        flat, wanted = picked.reshape(-1, picked.shape[-1]), targets.reshape(-1)
        logprobs, entropy = [], []
        # Recomputing pays only when there is more than one chunk to keep out of memory.
        recompute = torch.is_grad_enabled() and flat.shape[0] > LOGIT_CHUNK
        for start in range(0, flat.shape[0], LOGIT_CHUNK):
            chunk = (flat[start : start + LOGIT_CHUNK], wanted[start : start + LOGIT_CHUNK])
            if recompute:
                out = torch.utils.checkpoint.checkpoint(self._score, *chunk, use_reentrant=False)
            else:
                out = self._score(*chunk)
            logprobs.append(out[0])
            entropy.append(out[1])
        shape = targets.shape
        return torch.cat(logprobs).reshape(shape), torch.cat(entropy).reshape(shape)

    def _packed_hidden(self, input_ids: Tensor, attention_mask: Tensor, source: Tensor) -> Tensor:
        """Hidden states at ``source`` with the sequences packed into as few rows as hold them,
        each row as long as the longest sequence (first fit, longest first): no row is longer
        than a padded one, so attention never costs more, and most padding is gone. Positions
        restart at every sequence, which makes HF attend within each (no cache, no mask)."""
        lengths = attention_mask.sum(dim=-1).tolist()
        width = max(lengths)
        rows: list[list[int]] = []
        loads: list[int] = []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            fit = next((r for r, load in enumerate(loads) if load + lengths[i] <= width), None)
            if fit is None:
                rows.append([])
                loads.append(0)
                fit = len(rows) - 1
            rows[fit].append(i)
            loads[fit] += lengths[i]
        ids = input_ids.new_zeros((len(rows), width))
        steps = torch.arange(width, device=input_ids.device).repeat(len(rows), 1)
        row_of, start_of = [0] * len(lengths), [0] * len(lengths)
        for r, members in enumerate(rows):
            offset = 0
            for i in members:
                ids[r, offset : offset + lengths[i]] = input_ids[i, : lengths[i]]
                steps[r, offset:] = torch.arange(width - offset, device=input_ids.device)
                row_of[i], start_of[i] = r, offset
                offset += lengths[i]
        hidden: Tensor = self.model.base_model(
            input_ids=ids, position_ids=steps, use_cache=False
        ).last_hidden_state
        device = input_ids.device
        row = torch.tensor(row_of, device=device)[:, None]
        start = torch.tensor(start_of, device=device)[:, None]
        # Padding positions (masked out) may lie past a sequence's end: keep them inside it.
        last = torch.tensor(lengths, device=device)[:, None] - 1
        return hidden[row, start + torch.minimum(source, last)]

    def _score(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        head = self.model.get_output_embeddings()
        logits = head(hidden.float() if self.fp32_lm_head else hidden).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return filtered_logprobs(logits, targets, self.filters)


def load_policy(
    path: str | Path,
    *,
    dtype: str = "float32",
    fp32_lm_head: bool,
    device: str | torch.device = "cpu",
    temperature: float = 1.0,
    filters: SamplingFilters = NO_FILTERS,
    master_weights: bool = False,
    lora: LoraSpec | None = None,
    seed: int = 0,
) -> Policy:
    """Load an HF-format causal LM and its tokenizer from the local directory ``path``.

    ``dtype`` is the body's dtype (float32 | bfloat16 | float16): its parameters', or with
    ``master_weights`` the dtype it computes in (FSDP's mixed precision, scalerl.trainer.shard)
    from float32 parameters, which the optimizer then keeps in float32 too. Either way weights go
    out (broadcast, HF export) in ``dtype``. ``temperature`` and ``filters`` are the generators'
    sampling temperature (paper: not stated, 1.0) and top-p/top-k/min-p (default: off). With
    ``lora`` the model is frozen and a fresh adapter trains on it (`Policy.attach`, its start
    drawn from ``seed``). Raises DataError naming the path and what is missing or unreadable;
    InputError for a bad dtype or temperature.
    """
    torch_dtype = DTYPES.get(dtype)
    if torch_dtype is None:
        raise InputError(f"unknown model dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if not temperature > 0:
        raise InputError(f"sampling temperature must be > 0; got {temperature}")
    root = check_model_dir(path)
    model, tokenizer = _load_pretrained(root, torch.float32 if master_weights else torch_dtype)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps `to`
    model.eval()  # dropout off: trainer and generator must compute the same function
    policy = Policy(
        model,
        tokenizer,
        dtype=torch_dtype,
        fp32_lm_head=fp32_lm_head,
        temperature=temperature,
        path=root,
        filters=filters,
    )
    if fp32_lm_head:
        _upcast_head(policy)
        policy._restore_fp32_head(root)
    if lora is not None:
        policy.attach(lora, seed)
    return policy


def check_model_dir(path: str | Path) -> Path:
    """The model directory as a Path, or DataError saying what is missing."""
    root = Path(path)
    if not root.exists():
        raise DataError(f"model path {root} does not exist")
    if not root.is_dir():
        raise DataError(f"model path {root} is not a directory (expected an HF model directory)")
    if not (root / "config.json").is_file():
        raise DataError(f"model directory {root} has no config.json (not an HF-format model)")
    weights = list(root.glob("*.safetensors")) + list(root.glob("pytorch_model*.bin"))
    if not weights:
        raise DataError(f"model directory {root} has no weights (*.safetensors)")
    return root


def _load_pretrained(root: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, Any]:
    # Late import: transformers is heavy, and only the trainer process needs it.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(root), dtype=dtype, local_files_only=True)
    except LOAD_ERRORS as err:
        raise DataError(f"cannot load the model in {root}: {err}") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except LOAD_ERRORS as err:
        raise DataError(f"cannot load the tokenizer in {root}: {err}") from err
    for field in LOGIT_POSTPROCESSING:
        if getattr(model.config, field, None) not in (None, 1, 1.0):
            raise DataError(
                f"model in {root} post-processes its logits ({field}); the trainer supports "
                f"only models whose logits are lm_head(hidden)"
            )
    if not isinstance(model.get_output_embeddings(), nn.Linear):
        raise DataError(f"model in {root} has no linear LM head")
    _ensure_tied(model)
    return model, tokenizer


def _ensure_tied(model: PreTrainedModel) -> None:
    """A checkpoint saved with tied embeddings has no lm_head tensor; make sure the head really is
    the embedding (seen here: a load that left the head freshly initialised instead)."""
    config = model.config.get_text_config()
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(config, "tie_word_embeddings", False) and head.weight is not embeddings.weight:
        head.weight = embeddings.weight


def _upcast_head(policy: Policy) -> None:
    """Keep the head's parameter in float32; a tied embedding keeps feeding the body its dtype."""
    head = policy.head
    head.float()
    embeddings = policy.model.get_input_embeddings()
    if embeddings.weight is head.weight and policy.dtype != torch.float32:
        # Tied weights: the shared parameter is now float32, so cast the embedding lookup back.
        body_dtype = policy.dtype
        embeddings.register_forward_hook(lambda _m, _i, out: out.to(body_dtype))


def head_parameter_name(model: PreTrainedModel) -> str:
    """The state-dict name of the LM head weight as saved (the embedding's name when tied)."""
    head = model.get_output_embeddings()
    for name, param in model.named_parameters():  # deduplicated: the first (saved) name wins
        if param is head.weight:
            return name
    raise DataError("the model's LM head weight is not among its parameters")


def _tied_names(model: nn.Module) -> list[str]:
    """State-dict names that alias an earlier tensor (absent from safetensors checkpoints)."""
    seen: set[int] = set()
    aliases = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            aliases.append(name)
        seen.add(id(tensor))
    return aliases


def read_safetensors(directory: Path) -> dict[str, Tensor]:
    """All tensors of an HF safetensors checkpoint (single file or sharded with an index)."""
    index = directory / SAFETENSORS_INDEX
    try:
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            shards = ["model.safetensors"]
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_file(str(directory / shard)))
    except (*LOAD_ERRORS, json.JSONDecodeError) as err:
        raise DataError(f"cannot read the safetensors weights in {directory}: {err}") from err
    return state
