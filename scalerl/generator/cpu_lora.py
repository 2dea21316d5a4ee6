"""vLLM's LoRA products on CPU as one matrix multiply per adapter slot, not one per token.

vLLM's CPU backend applies adapters with the PyTorch ops of `vllm.lora.ops.torch_ops`. Each gives
every token its own copy of its adapter's matrix (`weights[indices]`: tokens x out x in) and then
multiplies token by token (`einsum("bi,boi->bo")`). A prefill of thousands of tokens thus copies
hundreds of megabytes per projection. Measured on the 25 M-parameter chat-arith model (5,120
prompt tokens, rank 16, 2 cores), the MLP's expand took 0.45 s where one matrix multiply takes
0.016 s, and a colocated LoRA run sampled 20 tokens/s.

Every token of a slot shares its matrix, so the same products are one matrix multiply per distinct
slot in the batch (all of a run's requests name its one adapter: one multiply). The functions
here compute that, with the originals' arguments and meaning: the same slot for each token
(negative indices count from the end, as indexing does), the same casts to the output's dtype,
the same writes into the output. A call whose shapes the grouping does not cover (inputs that
are not one row per index) goes to the original. `install()` puts them in place of the originals
in vLLM's CPU punica wrapper, which looks its ops up at each call; the GPU kernels are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_ORIGINALS: dict[str, Callable[..., Any]] = {}


def products(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Row t: `inputs[t] @ weights[indices[t]].T`. `weights` is (slots, [1,] out, in)."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    slots = torch.unique(indices).tolist()
    if len(slots) == 1:
        return inputs @ weights[slots[0]].T
    out = inputs.new_empty((inputs.shape[0], weights.shape[1]))
    for slot in slots:
        rows = indices == slot
        out[rows] = inputs[rows] @ weights[slot].T
    return out


def _grouped(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: Any) -> Any:
    """`products` in `dtype`, or None when the call is not one row of `inputs` per index."""
    if inputs.dim() != 2 or inputs.shape[0] != indices.numel() or weights.dim() not in (3, 4):
        return None
    return products(inputs.to(dtype), weights.to(dtype), indices)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINALS["bgmv_shrink"](
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling
        )
        return
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINALS["bgmv_expand"](
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs
        )
        return
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    # The adapter and the model may pad their output widths differently.
    width = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :width] += outputs[:limit, :width]
    else:
        output_tensor[:, :width] = outputs[:limit, :width]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINALS["bgmv_expand_slice"](
            inputs,
            lora_b_weights,
            output_tensor,
            lora_indices_tensor,
            slice_offset,
            slice_size,
            add_inputs,
        )
        return
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


# The prefill variants give each sequence's slot to each of its tokens, then do as above.


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    tokens = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, tokens, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    tokens = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, tokens, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    tokens = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, tokens, slice_offset, slice_size, add_inputs
    )


OPS: dict[str, Callable[..., None]] = {
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand": bgmv_expand,
    "bgmv_expand_slice": bgmv_expand_slice,
    "sgmv_shrink": sgmv_shrink,
    "sgmv_expand": sgmv_expand,
    "sgmv_expand_slice": sgmv_expand_slice,
}


def install() -> bool:
    """Put these ops in vLLM's CPU punica wrapper (idempotent); False where vLLM runs on
    another platform, whose kernels are left alone."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.lora.ops import torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name, op in OPS.items():
        _ORIGINALS.setdefault(name, getattr(torch_ops, name))
        setattr(punica_cpu, name, op)
    return True
