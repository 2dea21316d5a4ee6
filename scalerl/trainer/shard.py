"""Trainer ranks: the policy sharded with FSDP2 across the trainer processes.

Units: one per decoder layer, the head when it is not tied to the embeddings (kept in float32
with the FP32 head), and the root `Scorer`, which owns the embeddings, the final norm and a tied
head. On GPUs the layers compute in bfloat16 from float32 master weights and reduce gradients in
float32; on CPU everything stays float32.

The full weights come back one tensor at a time (`full_weights`): every rank gathers each
parameter in the same order and rank 0 keeps it, so the weight broadcast and the HF export never
hold the whole model twice.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from scalerl.environment import ProcessEnv
from scalerl.errors import DataError, InputError
from scalerl.rollout.keys import ALL_FILES, StreamKeys
from scalerl.sync.group import close_store, meeting_store
from scalerl.trainer.policy import Policy

CPU = torch.device("cpu")
# The ranks' store while this process is in their group: rank 0's serves it, and torch's
# process group calls back into it (NCCL meets again through it for each new communicator), so
# it lives until the group is left.
_store: dist.Store | None = None


class Ranks:
    """The trainer ranks as rank 0 leads them: every collective the followers must join
    (a step, a weight gather, a checkpoint) is announced first, with what it needs."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device = CPU) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether the policy is sharded: over several ranks, and on a GPU always (one rank
        too), since FSDP's mixed precision is what computes in bf16 from float32 masters."""
        return dist.is_initialized()

    def announce(self, kind: str, payload: Any = None) -> None:
        """Rank 0: tell the followers what comes next (nothing to do with a single rank)."""
        if self.world_size > 1:
            dist.broadcast_object_list([kind, payload], src=0)

    def next(self) -> tuple[str, Any]:
        """A follower: wait for rank 0's next announcement."""
        message: list[Any] = [None, None]
        dist.broadcast_object_list(message, src=0)
        return message[0], message[1]


def rank_device(env: ProcessEnv) -> torch.device:
    """This rank's device: the GPU of its local rank when there are GPUs, else the CPU."""
    if not torch.cuda.is_available():
        return CPU
    if env.trainer_local_rank >= torch.cuda.device_count():
        raise InputError(
            f"trainer rank {env.trainer_rank} is local rank {env.trainer_local_rank}, but this "
            f"machine shows {torch.cuda.device_count()} GPU(s)"
        )
    torch.cuda.set_device(env.trainer_local_rank)
    return torch.device("cuda", env.trainer_local_rank)


def join_ranks(env: ProcessEnv) -> Ranks:
    """This trainer's place among the run's trainer ranks, on its device; joins their process
    group when there is more than one rank or a GPU. Rank 0 serves the group's store on the bind
    address, like the sync store: with the run's keys (every run has them but a colocated one,
    which has one rank) behind CURVE, so a stranger at the port can neither join the ranks nor
    write to their store."""
    global _store
    ranks = Ranks(env.trainer_rank, env.trainer_ranks, rank_device(env))
    if ranks.world_size > 1:
        host = env.bind_host if ranks.leader else env.trainer_host
        where = f"trainer ranks at {host}:{env.ranks_port}: rank {ranks.rank} of {ranks.world_size}"
        # The ranks' pods may start minutes apart: they meet within the startup timeout.
        keys = StreamKeys.load(env.stream_keys, ALL_FILES) if env.stream_keys else None
        timeout_s = env.startup_timeout_s
        _store = meeting_store(host, env.ranks_port, ranks.rank, keys, timeout_s, where)
        init_ranks(_store, ranks.rank, ranks.world_size, ranks.device, timeout_s)
    elif ranks.device.type == "cuda":
        init_ranks(dist.HashStore(), 0, 1, ranks.device, env.peer_timeout_s)
    return ranks


def init_ranks(
    store: dist.Store, rank: int, world_size: int, device: torch.device, timeout_s: float
) -> None:
    """Join the trainers' own process group (gloo on CPU, NCCL on GPUs) through `store`."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def leave_ranks(finished: bool) -> None:
    """Leave the trainers' process group, if this process joined one. After a finished run every
    rank first waits for the others: rank 0 serves the group's store and must not go while a peer
    is still in a collective. After a failure the peers may be gone, so nobody waits."""
    global _store
    if not dist.is_initialized():
        return
    if finished:
        dist.barrier()
    dist.destroy_process_group()
    close_store(_store)
    _store = None


def end_rank_process(code: int) -> NoReturn:
    """End a sharded rank's process without Python's finalization, once it has left its group.

    FSDP2's device meshes keep the gloo group, and its native threads, alive past
    `destroy_process_group` (cached sharding specs hold the mesh, the mesh holds the group).
    Tearing those down while the interpreter finalizes can abort a rank ("terminate called
    without an active exception", SIGABRT) after every collective has finished. Nothing is left
    to do at that point but flush what was written."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def decoder_layers(policy: Policy) -> nn.ModuleList:
    """The body's decoder layers (HF's `model.layers` convention)."""
    layers = getattr(policy.model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise DataError(
            f"cannot shard {type(policy.model).__name__}: its body has no `layers` list"
        )
    return layers


def checkpoint_layers(policy: Policy) -> None:
    """Activation checkpointing: each decoder layer keeps only its input for the backward pass
    and recomputes the rest there. Done on the layers' forward, not by wrapping them, so
    parameter names (and checkpoints) stay the same with it on or off."""
    for layer in decoder_layers(policy):
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)


def shard_policy(policy: Policy) -> None:
    """Shard the policy in place across the ranks of the default process group.

    On GPUs the parameters are float32 master weights (`load_policy(master_weights=True)`): the
    layers gather them in the model's dtype to compute and reduce gradients in float32. The head
    computes in float32 with the FP32 head, in the model's dtype without it. On CPU everything
    runs in the parameters' own dtype."""
    gpu = policy.device.type == "cuda"
    compute = policy.dtype if gpu else None
    body = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32 if gpu else None)
    for layer in decoder_layers(policy):
        fully_shard(layer, mp_policy=body)
    head = policy.head
    if head.weight is not policy.model.get_input_embeddings().weight:
        head_dtype = torch.float32 if policy.fp32_lm_head else compute
        fully_shard(head, mp_policy=MixedPrecisionPolicy(param_dtype=head_dtype))
    # The root (embeddings, final norm, a tied head) computes in the parameters' dtype: float32
    # masters on GPUs, so a tied FP32 head stays float32.
    fully_shard(policy.scorer)


def is_sharded(policy: Policy) -> bool:
    return any(isinstance(p, DTensor) for p in policy.model.parameters())


class GatheredWeights:
    """The policy's weights for the weight sender, which reads them twice (layout, then send).
    Each pass is one gather that rank 0 announces and every rank joins, one tensor at a time."""

    def __init__(self, policy: Policy, ranks: Ranks) -> None:
        self.policy, self.ranks = policy, ranks

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        self.ranks.announce("weights")
        yield from full_weights(self.policy)


def full_weights(policy: Policy, cast: bool = True) -> Iterator[tuple[str, Tensor]]:
    """`policy.named_weights(cast)` with every sharded tensor gathered whole. A collective: every
    rank iterates it to the end; rank 0 gets the tensors, the others the same names and empty
    placeholders (gathering is the only work they do)."""
    leader = not dist.is_initialized() or dist.get_rank() == 0
    for name, tensor in policy.named_weights(cast):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        yield name, full if leader else full.new_empty(0)
