"""Shared pieces of the trainer tests: tiny random models on disk and rollout groups."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.rollout.records import RolloutGroup, Sample

# Smaller than the demo default: these tests check arithmetic, not capacity, and must stay fast.
SHAPE = TinyModelShape(hidden=64, layers=2, heads=4, intermediate=128, max_positions=128)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random float32 Llama (untied head) with the demo tokenizer."""
    return build_random_model(tmp_path_factory.mktemp("model") / "tiny", shape=SHAPE)


@pytest.fixture(scope="session")
def bf16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-bf16"
    return build_random_model(path, shape=SHAPE, dtype=torch.bfloat16)


def make_sample(
    reward: float,
    *,
    length: int = 5,
    version: int = 0,
    truncated: bool = False,
    seed: int = 0,
    loss_mask: Sequence[int] | None = None,
) -> Sample:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 90, (length,), generator=gen).tolist()
    return Sample(
        completion_ids=ids,
        logprobs=(-torch.rand(length, generator=gen) * 3).tolist(),
        versions=[version] * length,
        loss_mask=list(loss_mask) if loss_mask is not None else [1] * length,
        reward=reward,
        truncated=truncated,
        interrupted=False,
        finish_reason="length" if truncated else "stop",
    )


def make_group(
    rewards: Sequence[float],
    *,
    prompt_length: int = 3,
    version: int = 0,
    truncated: Sequence[bool] | None = None,
    lengths: Sequence[int] | None = None,
    seed: int = 0,
) -> RolloutGroup:
    """A group of ``len(rewards)`` samples with random tokens (ids 4..89 are printable chars)."""
    truncated = truncated or [False] * len(rewards)
    lengths = lengths or [5] * len(rewards)
    samples = [
        make_sample(r, length=n, version=version, truncated=t, seed=seed * 100 + i)
        for i, (r, t, n) in enumerate(zip(rewards, truncated, lengths, strict=True))
    ]
    prompt = torch.randint(4, 90, (prompt_length,), generator=torch.Generator().manual_seed(seed))
    return RolloutGroup(
        prompt_id=f"p{seed}", prompt_ids=[1, *prompt.tolist()], samples=samples, generator=0
    )


@pytest.fixture(name="make_group")
def make_group_fixture() -> Callable[..., RolloutGroup]:
    """`make_group` as a fixture, so test modules need not import this conftest."""
    return make_group


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared CPU they oversubscribe."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
