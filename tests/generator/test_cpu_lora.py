"""The grouped CPU LoRA ops compute what vLLM's own PyTorch ops compute, for any batch: any mix
of adapter slots per token (negative indices included), any slot count, dtype, offset and
padding; and `install()` puts them where vLLM's CPU punica wrapper calls them."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.lora.ops import torch_ops

from scalerl.generator import cpu_lora

DTYPES = [torch.float32, torch.bfloat16]


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    """A LoRA call's shapes and values: tokens in sequences, each sequence naming a slot."""
    slots = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    per_sequence = draw(
        st.lists(st.integers(-slots, slots - 1), min_size=len(lengths), max_size=len(lengths))
    )
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    return {
        "slots": slots,
        "lengths": torch.tensor(lengths),
        "sequence_slots": torch.tensor(per_sequence),
        "hidden": draw(st.integers(1, 24)),
        "rank": draw(st.integers(1, 8)),
        "pad": draw(st.integers(0, 3)),  # extra width the output has over the adapter's
        "four_d": draw(st.booleans()),  # vLLM stacks weights as (slots, 1, out, in)
        "dtype": draw(st.sampled_from(DTYPES)),
        "add": draw(st.booleans()),
        "scaling": draw(st.floats(0.1, 4.0)),
        "generator": generator,
    }


def rand(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


def stacked(b: dict[str, Any], out: int, inner: int) -> torch.Tensor:
    weights = rand(b["generator"], b["slots"], out, inner)
    return weights.unsqueeze(1) if b["four_d"] else weights


def same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # One matrix multiply against a per-token einsum: the same products, summed in another order.
    tol = 1e-5 if ours.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)


def both(op: str, output: torch.Tensor, *args: Any) -> None:
    """Run vLLM's op and ours on copies of `output`; they must write the same values."""
    theirs, ours = output.clone(), output.clone()
    getattr(torch_ops, op)(args[0], args[1], theirs, *args[2:])
    cpu_lora.OPS[op](args[0], args[1], ours, *args[2:])
    same(ours, theirs)


@settings(max_examples=150, deadline=None)
@given(b=batches())
def test_prefill_ops_match_vllms(b: dict[str, Any]) -> None:
    lengths, tokens = b["lengths"], int(b["lengths"].sum())
    starts = torch.cumsum(lengths, 0) - lengths
    meta = (starts, lengths, b["sequence_slots"], len(lengths), int(lengths.max()), tokens)
    x = rand(b["generator"], tokens, b["hidden"]).to(b["dtype"])
    shrunk = rand(b["generator"], tokens, b["rank"]).to(b["dtype"])
    a, bw = stacked(b, b["rank"], b["hidden"]), stacked(b, b["hidden"], b["rank"])
    both("sgmv_shrink", torch.zeros(tokens, b["rank"], dtype=b["dtype"]), x, a, *meta, b["scaling"])
    out = rand(b["generator"], tokens, b["hidden"] + b["pad"]).to(b["dtype"])
    both("sgmv_expand", out, shrunk, bw, *meta, b["add"])
    offset = b["pad"]  # a slice of a wider output, as vLLM's merged projections have
    both("sgmv_expand_slice", out, shrunk, bw, *meta, offset, b["hidden"], b["add"])


@settings(max_examples=150, deadline=None)
@given(b=batches())
def test_decode_ops_match_vllms(b: dict[str, Any]) -> None:
    indices = torch.repeat_interleave(b["sequence_slots"], b["lengths"])
    tokens = indices.numel()
    x = rand(b["generator"], tokens, b["hidden"]).to(b["dtype"])
    shrunk = rand(b["generator"], tokens, b["rank"]).to(b["dtype"])
    a, bw = stacked(b, b["rank"], b["hidden"]), stacked(b, b["hidden"], b["rank"])
    both(
        "bgmv_shrink", torch.zeros(tokens, b["rank"], dtype=b["dtype"]), x, a, indices, b["scaling"]
    )
    out = rand(b["generator"], tokens, b["hidden"] + b["pad"]).to(b["dtype"])
    both("bgmv_expand", out, shrunk, bw, indices, b["add"])
    both("bgmv_expand_slice", out, shrunk, bw, indices, b["pad"], b["hidden"], b["add"])


def test_one_slot_is_one_matrix_multiply() -> None:
    x, weights = torch.randn(7, 5), torch.randn(2, 1, 3, 5)
    ours = cpu_lora.products(x, weights, torch.ones(7, dtype=torch.long))
    assert torch.equal(ours, x @ weights[1, 0].T)


def test_calls_it_does_not_group_go_to_vllms_op() -> None:
    # One index for a batch of rows: vLLM's einsum broadcasts it; ours hands the call over.
    cpu_lora.install()
    x, weights, index = torch.randn(4, 5), torch.randn(2, 3, 5), torch.tensor([1])
    theirs, ours = torch.zeros(4, 3), torch.zeros(4, 3)
    torch_ops.bgmv_shrink(x, weights, theirs, index, 2.0)
    cpu_lora.bgmv_shrink(x, weights, ours, index, 2.0)
    assert torch.equal(ours, theirs)


def test_install_replaces_the_ops_vllms_cpu_wrapper_calls() -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    assert cpu_lora.install()
    for name, op in cpu_lora.OPS.items():
        assert getattr(punica_cpu, name) is op
    assert cpu_lora.install()  # twice is once: the originals are still vLLM's
    assert all(cpu_lora._ORIGINALS[name] is getattr(torch_ops, name) for name in cpu_lora.OPS)


def test_the_worker_extension_installs_them_where_the_model_runs() -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    import scalerl.generator.worker

    for name in cpu_lora.OPS:  # as vLLM ships them
        setattr(punica_cpu, name, getattr(torch_ops, name))
    # A first import, as in the model's process, but of a private copy: reloading the real module
    # would make a second WeightSyncExtension class, and vLLM refuses to mix that into a worker
    # class that an earlier in-process engine in this interpreter already extended with the first.
    spec = importlib.util.spec_from_file_location(
        "scalerl_worker_first_import", scalerl.generator.worker.__file__
    )
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    for name, op in cpu_lora.OPS.items():
        assert getattr(punica_cpu, name) is op


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_empty_batch_writes_nothing(dtype: torch.dtype) -> None:
    out = torch.ones(0, 3, dtype=dtype)
    cpu_lora.bgmv_expand(
        torch.zeros(0, 2, dtype=dtype), torch.randn(1, 3, 2), out, torch.zeros(0, dtype=torch.long)
    )
    assert out.shape == (0, 3)
