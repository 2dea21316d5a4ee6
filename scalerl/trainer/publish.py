"""How the trainer hands each new policy version to the generators: `WeightPublisher`, chosen by
whoever builds the trainer, so the training loop never asks which transport it is on.

`BroadcastPublisher` (the trainer's own process): every version crosses torch.distributed to the
generators' engines (`scalerl.sync`). The colocated process builds its own publisher, which loads
the policy into the engine in memory (`scalerl.colocated`). Under LoRA both hand over the adapter
alone: the policy's weights are then its adapter's (`Policy.named_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from scalerl.errors import WeightSyncError
from scalerl.rollout.keys import StreamKeys
from scalerl.rollout.records import UpdateWeights
from scalerl.rollout.stream import GeneratorGone
from scalerl.sync.group import Gone, SyncGroup, close_store, connect, serve_meeting
from scalerl.sync.weights import WeightSender
from scalerl.trainer.shard import GatheredWeights, Ranks

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import Store

    from scalerl.rollout.pipe import TrainerEnd
    from scalerl.rollout.stream import TrainerChannel
    from scalerl.trainer.policy import Policy

    Channel = TrainerChannel | TrainerEnd


@dataclass(frozen=True)
class Published:
    """What handing one version over took: wall seconds (`weight_sync_seconds`) and the bytes
    of tensors that moved (`weight_sync_bytes`: the adapter alone with LoRA)."""

    seconds: float
    bytes: int


def tensor_bytes(named: Iterable[tuple[str, Tensor]]) -> int:
    return sum(tensor.numel() * tensor.element_size() for _, tensor in named)


class WeightPublisher(Protocol):
    """Where the trainer's new policy versions go, and on what terms it has the device."""

    def start(self, channel: Channel, generators: int, gone: Gone | None = None) -> None:
        """Once every generator has said hello on `channel`: get ready to publish (`gone` as in
        regroup: a generator that said hello may die before it joins)."""
        ...

    def publish(self, policy: Policy, version: int) -> Published:
        """Hand `policy` to the generators as `version`, telling them on the channel."""
        ...

    def regroup(
        self,
        generation: int,
        members: list[int],
        join_timeout_s: float,
        gone: Gone | None = None,
    ) -> None:
        """Form the generators' group anew as `generation`, of `members` (each was told to join
        it): after a generator died or before one joins. RanksMissing names who did not come;
        `gone`, asked while they are awaited, names members known to be gone (no more wait)."""
        ...

    def device(self) -> AbstractContextManager[None]:
        """The device for one training step (colocated: taken from the engine)."""
        ...

    def stepped(self, seconds: float) -> None:
        """A step is done; it took `seconds` of steady work (the trainer's wall time since the
        last, less evaluations and checkpoints). Colocated on a CPU, these decide how the
        trainer shares the cores with the engine."""
        ...

    def close(self) -> None:
        """Release what `start` formed; safe before `start` and twice."""
        ...


@dataclass
class BroadcastPublisher:
    """Each version broadcast to every generator over the weight-sync group, which trainer rank 0
    forms with them at `host:port`. The generators hear `UpdateWeights` first: their engines
    must be receiving before the broadcast can go through."""

    host: str
    port: int
    timeout_s: float
    join_timeout_s: float | None = None  # the generators join after their engines start
    ranks: Ranks = field(default_factory=Ranks)  # a sharded policy is gathered from every rank
    keys: StreamKeys | None = None  # the run's keys: only its generators reach the sync store
    channel: Channel | None = None
    group: SyncGroup | None = None
    sender: WeightSender | None = None

    store: Store | None = None  # served for the whole run: every generation meets on it
    members: list[int] = field(default_factory=list)

    def start(self, channel: Channel, generators: int, gone: Gone | None = None) -> None:
        self.channel = channel
        joining_s = self.timeout_s if self.join_timeout_s is None else self.join_timeout_s
        self.store = serve_meeting(self.host, self.port, self.keys, joining_s)
        self.regroup(0, list(range(generators)), joining_s, gone=gone)

    def regroup(
        self,
        generation: int,
        members: list[int],
        join_timeout_s: float,
        gone: Gone | None = None,
    ) -> None:
        self.close_group()
        rank_of = {generator: rank for rank, generator in enumerate(members, start=1)}
        self.group = connect(
            self.host,
            self.port,
            len(members) + 1,
            0,
            timeout_s=self.timeout_s,
            join_timeout_s=join_timeout_s,
            generation=generation,
            store=self.store,
            gone=None if gone is None else lambda: [rank_of[g] for g in gone() if g in rank_of],
        )
        self.members = list(members)
        self.sender = WeightSender(self.group)

    def publish(self, policy: Policy, version: int) -> Published:
        if self.channel is None or self.sender is None:
            raise WeightSyncError(f"version {version} published before the sync group formed")
        for generator in self.members:  # receivers only: one still starting is not in the group
            try:
                self.channel.send(generator, UpdateWeights(version=version))
            except GeneratorGone as err:  # died since the group formed: the group is broken
                raise WeightSyncError(f"version {version} not sent: {err}") from err
        sent = self.sender.send(GatheredWeights(policy, self.ranks), version)
        return Published(sent.seconds, sent.bytes)

    def device(self) -> AbstractContextManager[None]:
        return nullcontext()  # the generators have devices of their own

    def stepped(self, seconds: float) -> None:
        pass  # nothing here shares the trainer's device

    def close_group(self) -> None:
        if self.group is not None:
            self.group.close()  # a receiver still waiting on it fails at once
        self.group = self.sender = None

    def close(self) -> None:
        self.close_group()
        close_store(self.store)
        self.store = None
