"""The trainer's generators as a pool that changes while it trains (PipelineRL takes whatever
rollouts arrive): which generators are in the weight-sync group now (`members`), which started
mid-run and wait to be let in (`joining`), and what the pool's changes cost.

A generator is lost when its process is gone (a send to it fails: killed, OOM, its pod deleted),
when it reports a Failure, or when a weight broadcast breaks and it does not rejoin. The trainer
then forms the group again of the others, hands them the current weights (each member's share of
a batch grows, so the steps go on) and trains on. Its replacement (started by `scalerl run` or
the operator, same index, same shard) says hello, gets Start with the data position including the
groups the trainer holds, starts its engine, says Ready, and is let in by the next formation,
which hands it the current weights before it samples. A trainer's failure still restarts the
gang (scalerl.local, the operator).

A pool scaled while it runs (`kubectl scale srl`: the operator resizes the generators' Job) works
the same way: a new index joins as a replacement does, and one past the new size is lost as its
pod goes. The trainer follows the size the run asks for (`follow`), which its evaluations are
divided by and its metrics show.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerl.errors import PeerError, WeightSyncError
from scalerl.rollout.position import DataPosition
from scalerl.rollout.records import Ping, Regroup, RolloutGroup, Start, Stop, ToGenerator
from scalerl.rollout.stream import GeneratorGone, TrainerChannel
from scalerl.sync.group import REJOIN_S, RanksMissing

if TYPE_CHECKING:
    from scalerl.environment import ProcessEnv
    from scalerl.metrics import TrainerMetrics
    from scalerl.recipe import NoPositiveResampling
    from scalerl.rollout.pipe import TrainerEnd
    from scalerl.rollout.records import GeneratorStats
    from scalerl.spec import ScaleRLRun
    from scalerl.status import StatusSink
    from scalerl.trainer.history import TrainerState
    from scalerl.trainer.publish import WeightPublisher

log = logging.getLogger("scalerl.trainer")

# How often the trainer checks, while it waits, that every member is still connected.
CHECK_EVERY_S = 1.0


@dataclass
class Pool:
    desired: int  # spec.generators.replicas, as the run asks now
    members: list[int]  # in the sync group now, in rank order (rank 1 onwards)
    joining: set[int] = field(default_factory=set)  # said hello mid-run, not yet Ready
    known: set[int] = field(default_factory=set)  # indexes in the pool's size once (replaced)
    starts: dict[int, int] = field(default_factory=dict)  # processes started mid-run per index
    generation: int = 0  # of the sync group (scalerl.sync.group)
    formed: float = 0.0  # when that generation formed
    checked: float = 0.0  # when the members were last checked
    counted: float = field(default_factory=time.monotonic)  # degraded time counted up to here
    degraded_s: float = 0.0  # seconds degraded counted and not yet taken (`take_degraded_s`)
    sent: dict[int, float] = field(default_factory=dict)  # when each last sent a rollout

    @classmethod
    def of(cls, desired: int) -> Pool:
        members = list(range(desired))
        return cls(desired, members, known=set(members), checked=time.monotonic())

    @property
    def degraded(self) -> bool:
        """Fewer generators sample than the run asks for (one lost, its replacement starting)."""
        return len(self.members) < self.desired

    def count(self) -> None:
        """Count the time since the last count as degraded or not: done before every change of
        the pool, so each stretch is counted under the pool it had."""
        now = time.monotonic()
        if self.degraded:
            self.degraded_s += now - self.counted
        self.counted = now

    def take_degraded_s(self) -> float:
        """The seconds degraded since this was last taken."""
        self.count()
        taken, self.degraded_s = self.degraded_s, 0.0
        return taken

    def resize(self, desired: int) -> None:
        self.count()
        self.desired = desired
        self.known = {g for g in self.known if g < desired}

    def lose(self, generators: list[int], why: str, step: int) -> bool:
        """Take `generators` out of the pool at training step `step`; whether any was in it."""
        self.count()
        lost = [g for g in generators if g in self.members or g in self.joining]
        for g in lost:
            log.warning("generator %d lost at step %d (%s); training goes on", g, step, why)
        self.members = [g for g in self.members if g not in lost]
        self.joining.difference_update(lost)
        return bool(lost)

    def admit(self, generator: int) -> bool:
        """Let `generator` in; whether it replaces one (else it joins a pool scaled up)."""
        self.count()
        replaces = generator in self.known
        self.joining.discard(generator)
        self.members = sorted({*self.members, generator})
        self.known.add(generator)
        return replaces

    def processes(self) -> set[tuple[int, int]]:
        """The members as processes: (index, how many started under it mid-run)."""
        return {(g, self.starts.get(g, 0)) for g in self.members}

    def next_generation(self) -> int:
        self.generation += 1
        self.formed = time.monotonic()
        return self.generation

    def since_changed(self, heard: float) -> float:
        """When the trainer last heard from the pool as it is: the pool's members get their
        time from when they formed (a replacement that just joined has generated nothing yet,
        however long the pool was without it)."""
        return max(heard, self.formed)

    def quiet(self, since: float, held: set[int]) -> list[int]:
        """The members that sent no rollout since `since` (or since the pool formed) and have
        none `held` for the batch, while the others did: alive to a ping, perhaps, but not
        generating. A member whose groups are held may have sent its share ahead and wait for
        the next version. None when every member is quiet (then the trainer itself, or the
        run's data, may be at fault)."""
        start = max(since, self.formed)
        quiet = [g for g in self.members if g not in held and self.sent.get(g, -math.inf) < start]
        return quiet if len(quiet) < len(self.members) else []

    def due(self) -> bool:
        """Whether it is time to check the members again."""
        now = time.monotonic()
        if now - self.checked < CHECK_EVERY_S:
            return False
        self.checked = now
        return True


class ElasticPool:
    """The trainer's side of a pool that changes (module doc); `scalerl.trainer.loop.Trainer`
    has what it needs."""

    env: ProcessEnv
    channel: TrainerChannel | TrainerEnd
    publisher: WeightPublisher
    pool: Pool
    run: ScaleRLRun
    status: StatusSink
    reported: tuple[bool, str, str] | None  # the Degraded condition as last written
    state: TrainerState
    backlog: list[RolloutGroup]
    curriculum: NoPositiveResampling
    metrics: TrainerMetrics
    generator_stats: dict[int, GeneratorStats]
    generation_spent: dict[str, float]

    def publish(self) -> None: ...

    def receive(self, timeout_s: float) -> None: ...

    @property
    def elastic(self) -> bool:
        """Generators in processes of their own can be lost and replaced; a colocated run's
        one lives and fails with this process."""
        return isinstance(self.channel, TrainerChannel)

    def welcome(self, generator: int) -> None:
        """A generator said hello mid-run: a replacement (its predecessor, if still counted, is
        gone). It gets where the run stands, the groups the trainer holds counting as served."""
        if not self.elastic:
            raise PeerError(f"generator {generator} restarted mid-run; restarting the gang")
        self.retire(generator)
        self.lose([generator], "it started again")
        self.pool.starts[generator] = self.pool.starts.get(generator, 0) + 1
        start = Start(
            version=self.state.version,
            step=self.state.step,
            curriculum=self.curriculum.state_dict(),
            consumed=self.position(),
            generation=self.pool.generation,
            members=self.pool.members,
        )
        if not self.tell([generator], start):  # gone already: the runner sees it exit
            self.pool.joining.add(generator)

    def admit(self, generator: int) -> None:
        """A replacement's (or a new generator's) engine is up: the group forms again with it,
        and it gets the current weights before it samples (the members get them again too: one
        broadcast)."""
        if self.pool.admit(generator):
            self.state.bump("generator_replacements")
            self.metrics.generator_replacements.inc()
        log.info("generator %d joins the weight-sync group at step %d", generator, self.state.step)
        self.regroup()

    def follow(self, desired: int | None) -> None:
        """The pool's size as the run asks for it now (None: unchanged). A member past it is
        being removed (its pod deleted) and is lost when it goes, as any other."""
        if desired is None or desired == self.pool.desired:
            return
        log.info(
            "generators scaled from %d to %d at step %d",
            self.pool.desired,
            desired,
            self.state.step,
        )
        self.pool.resize(desired)
        self.report_pool()
        self.metrics.generators_desired.set(desired)

    def lose(self, generators: list[int], why: str) -> None:
        if self.pool.lose(generators, why, self.state.step):
            self.regroup()

    def give_up(self, generators: list[int], silent: float) -> None:
        """Generators that sent nothing for the peer timeout while the others sent theirs: they
        stop answering (a hung engine, a frozen process), and the others take their share. Each
        is told it is lost (an awake one exits failed, and is replaced), and its supervisor is
        asked to end it (a local run's runner does; scalerl.status)."""
        why = f"no rollouts for {silent:.0f} s (the peer timeout) while the others sent theirs"
        self.abandon(generators, why)
        self.lose(generators, why)

    def abandon(self, generators: list[int], why: str) -> None:
        """Generators lost while their processes look alive: each is told so (Stop, lost) and
        its supervisor asked to end it, so that a replacement starts."""
        self.tell(generators, Stop(f"unresponsive: {why}", lost=True))
        hellos = getattr(self.channel, "hellos", {})
        for generator in generators:
            hello = hellos.get(generator)
            self.status.gave_up(generator, hello and hello.pid, hello and hello.host, why)

    def count_degraded(self) -> None:
        """After a step: the seconds the pool was short since the last, and this step if the pool
        is short now (trained on fewer generators than the run asks for)."""
        self.metrics.generators_degraded_seconds.inc(self.pool.take_degraded_s())
        if self.pool.degraded:
            self.state.bump("degraded_steps")
            self.metrics.degraded_steps.inc()

    def regroup(self) -> None:
        """Form the sync group anew of the pool's members and hand them the current weights;
        a member that does not join, or breaks the broadcast and is gone, is lost too."""
        while True:
            generation, members = self.pool.next_generation(), list(self.pool.members)
            regroup = Regroup(generation, members, self.curriculum.state_dict(), self.position())
            gone = self.tell(members, regroup)
            if gone:
                self.pool.lose(gone, "its process is gone", self.state.step)
                continue
            try:
                # A member killed just now may have looked alive to the Regroup sent to it.
                self.publisher.regroup(generation, members, REJOIN_S, gone=self.unreachable)
                self.publish()
            except RanksMissing as err:
                missing = [members[r - 1] for r in err.missing or () if r >= 1]
                gone = self.unreachable()
                if not self.pool.lose(missing or gone, str(err), self.state.step):
                    raise
                # Connected and not joining (a frozen process): ended by its supervisor.
                self.abandon([g for g in missing if g not in gone], str(err))
                continue
            except WeightSyncError as err:
                if not self.pool.lose(self.unreachable(), str(err), self.state.step):
                    raise
                continue
            self.metrics.generators_ready.set(len(members))
            log.info("weight-sync group %d formed of generators %s", generation, members)
            self.report_pool()
            return

    def minimum(self) -> int:
        """The generators below which training waits (`generators.minReplicas`, at most the
        size the run asks for now)."""
        return min(self.run.spec.generators.min_replicas, self.pool.desired)

    def report_pool(self) -> None:
        """The run's Degraded condition, written when it changes: True while fewer generators
        sample than the run asks for, its reason whether training goes on meanwhile."""
        ready, desired, minimum = len(self.pool.members), self.pool.desired, self.minimum()
        if ready >= desired:
            state = (False, "GeneratorsReady", f"{ready} of {desired} generators ready")
        elif ready >= minimum:
            state = (True, "GeneratorsShort", f"{ready} of {desired} generators ready; "
                     "training goes on while the others start")  # fmt: skip
        else:
            state = (True, "BelowMinReplicas", f"{ready} of {desired} generators ready, below "
                     f"generators.minReplicas {minimum}: training waits for them")  # fmt: skip
        if state != self.reported:
            self.reported = state
            self.status.condition("Degraded", *state)

    def position(self) -> dict[str, list[int]]:
        """The data position a generator starts serving from: what the steps consumed, and the
        groups the trainer holds for the next ones (served: they are trained anyway)."""
        position = DataPosition.from_dict(self.state.consumed)
        for group in self.backlog:
            position.consume(group.prompt_id, group.epoch)
        return position.to_dict()

    def tell(self, generators: list[int], message: ToGenerator) -> list[int]:
        """Send `message` to each of `generators`; those that are gone."""
        gone = []
        for generator in generators:
            try:
                self.channel.send(generator, message)
            except GeneratorGone:
                gone.append(generator)
        return gone

    def unreachable(self) -> list[int]:
        return self.tell(self.pool.members, Ping())

    def collect(self, groups: int) -> list[RolloutGroup]:
        """The next `groups` rollout groups, held in order of arrival; a member that stops
        answering meanwhile is given up (`give_up`), a pool that does fails the gang."""
        heard = since = time.monotonic()
        while len(self.backlog) < groups:
            heard = self.pool.since_changed(heard)
            if (silent := time.monotonic() - heard) > self.waiting_s():
                held = {group.generator for group in self.backlog}
                if self.elastic and (quiet := self.pool.quiet(since, held)):
                    self.give_up(quiet, silent)  # the others go on
                    heard = time.monotonic()
                    continue
                limit = "the peer timeout" if self.pool.members else (
                    "the startup timeout: every generator is lost, none joined again"
                )  # fmt: skip
                raise PeerError(f"no rollouts from the generators for {silent:.0f} s ({limit})")
            before = len(self.backlog)
            self.receive(1.0)
            self.watch()
            if len(self.backlog) > before:
                heard = time.monotonic()
        taken, self.backlog = self.backlog[:groups], self.backlog[groups:]
        return taken

    def waiting_s(self) -> float:
        return self.patience(self.env.peer_timeout_s, self.env.startup_timeout_s)

    def wait_for_minimum(self) -> None:
        """Below `generators.minReplicas` no step is trained: the trainer waits for the lost
        generators' replacements (holding what the others send), as long as a start may take."""
        since = time.monotonic()
        while len(self.pool.members) < self.minimum():
            if (waited := time.monotonic() - since) > self.env.startup_timeout_s:
                raise PeerError(
                    f"{len(self.pool.members)} of {self.pool.desired} generators ready for "
                    f"{waited:.0f} s, below generators.minReplicas {self.minimum()} (the startup "
                    "timeout)"
                )
            self.receive(1.0)
            self.watch()

    def patience(self, peer_timeout_s: float, startup_timeout_s: float) -> float:
        """How long to wait for the generators: a member answers within the peer timeout; with
        none left (every generator lost, a replacement starting: it loads its model and engine
        first) as long as a start may take, the startup timeout."""
        if self.pool.members or not self.elastic:
            return peer_timeout_s
        return startup_timeout_s

    def watch(self) -> None:
        """While waiting: a member whose process is gone is lost now, so that the others take
        its share of the batch at once."""
        if self.elastic and self.pool.due():
            gone = self.unreachable()
            if gone:
                self.lose(gone, "its process is gone")

    def retire(self, generator: int) -> None:
        """A generator's process is replaced: what it generated stays in the run's totals."""
        stats = self.generator_stats.pop(generator, None)
        if stats is None:
            return
        spent = self.generation_spent
        for name, value in stats.counts().items():
            spent[name] = spent.get(name, 0.0) + value
