"""How long the trainer waits for rollouts: the peer timeout while a generator is left to deliver
them; with every generator lost (a pool of one whose generator was killed), as long as its
replacement may take to start (it loads its model and engine first): the startup timeout."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from test_signal import conditions, trainer

from scalerl.errors import PeerError
from scalerl.rollout import GeneratorChannel, TrainerChannel
from scalerl.rollout.records import EvalResult, Evaluate, Ready, Regroup, Start, Stop
from scalerl.status import FileStatus
from scalerl.status.history import PromptScore
from scalerl.sync.group import RanksMissing
from scalerl.trainer.pool import Pool

T = TypeVar("T")


def test_with_every_generator_lost_the_trainer_waits_a_start_not_a_peer_timeout(
    tmp_path: Path,
) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    t.env = dataclasses.replace(t.env, peer_timeout_s=0.2, startup_timeout_s=1.5)
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        t.channel = channel
        t.pool = Pool(desired=1, members=[])  # its one generator lost, the replacement starting
        with pytest.raises(PeerError, match=r"the startup timeout: every generator is lost"):
            t.collect(1)
        # A member left, connected and silent: it should deliver within the peer timeout.
        with GeneratorChannel(channel.endpoint, 0, linger_s=0) as generator:
            generator.hello(timeout_s=5)
            assert channel.wait_for_generators(1, timeout_s=5) == {0}
            t.pool = Pool(desired=1, members=[0])
            with pytest.raises(PeerError, match=r"s \(the peer timeout\)"):
                t.collect(1)


def test_a_pool_scaled_while_it_runs_is_followed_and_a_new_generator_is_no_replacement(
    tmp_path: Path,
) -> None:
    """`kubectl scale srl/NAME --replicas=3`, then 1: the trainer follows the size the run asks
    for (its gauge, its evaluations' division); generator 2 joining is the pool growing, not a
    replacement; after the pool shrank past it, its return is a join again."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.pool = Pool.of(2)
    t.follow(None)  # a local run: the size its spec said
    assert t.pool.desired == 2
    t.follow(3)
    assert (t.pool.desired, t.metrics.generators_desired._value.get()) == (3, 3)
    assert t.pool.admit(2) is False  # joins: the pool grew
    assert t.pool.admit(0) is True  # index 0 came back: a replacement
    t.follow(1)
    assert (t.pool.desired, t.metrics.generators_desired._value.get()) == (1, 1)
    assert t.pool.admit(1) is False  # scaled away, then asked for again


@dataclass
class NoWeights:
    """A publisher whose group forms at once and that sends no weights."""

    def regroup(self, generation: int, members: list[int], timeout_s: float, **_: Any) -> None:
        pass

    def publish(self, policy: Any, version: int) -> Any:
        return SimpleNamespace(seconds=0.0, bytes=0)


def next_of(channel: GeneratorChannel, kind: type[T]) -> T:
    """The next message of `kind` the generator's end receives (others skipped)."""
    while True:
        message = channel.recv(timeout_s=10)
        assert message is not None, f"no {kind.__name__} within 10 s"
        if isinstance(message, kind):
            return message


def test_an_evaluation_asked_of_a_process_that_died_is_asked_of_its_replacement(
    tmp_path: Path,
) -> None:
    """Generator 0 is killed while it evaluates; its replacement (same index, another process)
    joins and is asked for the share: the request the dead process took is not counted as
    asked (it waited for an answer that never came: 'generators [0] did not answer')."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.env = dataclasses.replace(t.env, peer_timeout_s=5.0)
    t.publisher = NoWeights()  # type: ignore[assignment]
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        t.channel = channel
        t.pool = Pool.of(1)
        with GeneratorChannel(channel.endpoint, 0, linger_s=0) as first:
            first.hello(timeout_s=5)
            channel.wait_for_generators(1, timeout_s=5)
            with ThreadPoolExecutor(1) as pool:
                evaluation = pool.submit(t.ask_for_evaluation)
                assert next_of(first, Evaluate).shard == 0
                first.close()  # killed while it evaluates
                with GeneratorChannel(channel.endpoint, 0, linger_s=0) as second:
                    second.hello(timeout_s=5)
                    next_of(second, Start)
                    second.send(Ready(generator=0))
                    asked = next_of(second, Evaluate)
                    score = PromptScore("p0", samples=2, correct=1, truncated=0)
                    answer = EvalResult(asked.step, asked.version, 0, [score], tokens=4)
                    second.send(answer)
                    assert evaluation.result(timeout=10) == [answer]
    assert (asked.shard, asked.shards) == (0, 1)


def test_a_replacement_that_joins_gets_the_peer_timeout_from_its_join_not_from_the_loss(
    tmp_path: Path, make_group: Any
) -> None:
    """The pool's only generator was lost; its replacement starts (longer than the peer
    timeout: it loads its engine) and joins. The trainer waits for its rollouts a peer timeout
    from the join, not from the last rollout the pool sent before the loss (the cluster run's
    'no rollouts from the generators for 28 s (the peer timeout)' right after the join)."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.env = dataclasses.replace(t.env, peer_timeout_s=3.0, startup_timeout_s=30.0)
    t.publisher = NoWeights()  # type: ignore[assignment]
    group = make_group([1.0, 0.0])
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        t.channel = channel
        t.pool = Pool(desired=1, members=[])  # generator 0 lost, its replacement starting

        def replacement() -> None:
            with GeneratorChannel(channel.endpoint, 0, linger_s=0) as generator:
                time.sleep(4.0)  # its engine starting: longer than the peer timeout
                generator.hello(timeout_s=5)
                next_of(generator, Start)
                generator.send(Ready(generator=0))
                next_of(generator, Regroup)
                time.sleep(0.5)  # its first rollouts, well within a peer timeout of the join
                generator.send(group)
                time.sleep(1.0)  # connected until the trainer took them

        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(replacement)
            assert t.collect(1) == [group]
            started.result(timeout=10)
    assert t.pool.members == [0]


@dataclass
class FormsWithoutTheGone(NoWeights):
    """A group formation that, as scalerl.sync.group's does, stops waiting for members `gone`
    names, and otherwise fails for those that never came; and records what formed."""

    formed: list[list[int]] = dataclasses.field(default_factory=list)

    def start(self, channel: Any, generators: int, gone: Any = None) -> None:
        deadline = time.monotonic() + 10.0  # its join timeout
        missing = list(range(generators))  # none joins here: all, unless some are known gone
        while gone is not None and time.monotonic() < deadline:
            if known := gone():
                missing = known
                break
            time.sleep(0.1)
        raise RanksMissing(f"generators {missing} did not join", [g + 1 for g in missing])

    def regroup(self, generation: int, members: list[int], timeout_s: float, **_: Any) -> None:
        self.formed.append(members)


def test_a_generator_that_said_hello_and_died_before_the_group_formed_is_lost_not_fatal(
    tmp_path: Path,
) -> None:
    """A gang's start: generator 0 said hello and died before it joined the weight-sync group
    (its pod failing as the gang starts). The trainer forms the group without it and goes on;
    its replacement joins as any does mid-run (it used to wait on the formation, its
    replacement's hello unread, until the gang restarted)."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.publisher = FormsWithoutTheGone()  # type: ignore[assignment]
    one = t.spec.generators.model_copy(update={"replicas": 1})
    t.run = t.run.model_copy(update={"spec": t.spec.model_copy(update={"generators": one})})
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        t.channel = channel
        with GeneratorChannel(channel.endpoint, 0, linger_s=0) as doomed:
            doomed.hello(timeout_s=5)
            channel.wait_for_generators(1, timeout_s=5)
        t.start_generators()
    assert t.pool.members == [] and t.publisher.formed == [[]]  # type: ignore[attr-defined]


def test_the_time_and_steps_a_pool_is_short_are_counted(tmp_path: Path) -> None:
    """scalerl_generators_degraded_seconds and scalerl_degraded_steps (and history's
    `degraded_steps`): from a generator's loss to its replacement's join, measured here by the
    test's own clock around the same events."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.pool = Pool.of(2)
    time.sleep(0.1)
    t.count_degraded()  # a step with the whole pool
    lost_at = time.monotonic()
    t.pool.lose([1], "killed", step=1)
    time.sleep(0.2)
    t.count_degraded()  # a step trained on generator 0 alone
    t.count_degraded()  # and another
    time.sleep(0.2)
    t.pool.admit(1)
    joined_at = time.monotonic()
    time.sleep(0.1)
    t.count_degraded()  # the pool whole again
    seconds = t.metrics.generators_degraded_seconds._value.get()
    assert 0.4 <= seconds <= joined_at - lost_at
    assert t.metrics.degraded_steps._value.get() == 2
    assert t.state.counters["degraded_steps"] == 2
    t.follow(3)  # scaled up: short of the new size until generator 2 joins
    t.count_degraded()
    assert t.state.counters["degraded_steps"] == 3


class Recorded(FileStatus):
    """The run's status files, and every condition written, in order."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.written: list[tuple[str, bool, str]] = []

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.written.append((type_, status, reason))
        super().condition(type_, status, reason, message)


def with_generators(t: Any, replicas: int, min_replicas: int) -> None:
    generators = t.spec.generators.model_copy(
        update={"replicas": replicas, "min_replicas": min_replicas}
    )
    t.run = t.run.model_copy(update={"spec": t.spec.model_copy(update={"generators": generators})})


def test_below_min_replicas_training_waits_for_the_replacement_and_the_run_says_so(
    tmp_path: Path, make_group: Any
) -> None:
    """generators.minReplicas 2 of 2: with generator 1 lost no step is trained (the run is
    Degraded, BelowMinReplicas); what generator 0 sends meanwhile is held, and training goes on
    once the replacement joined (Degraded false again)."""
    t = trainer(tmp_path, no_signal_steps=3)
    with_generators(t, replicas=2, min_replicas=2)
    t.status = Recorded(tmp_path)
    t.env = dataclasses.replace(t.env, peer_timeout_s=5.0, startup_timeout_s=30.0)
    t.publisher = NoWeights()  # type: ignore[assignment]
    group = make_group([1.0, 0.0])
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        t.channel = channel
        t.pool = Pool.of(2)
        with GeneratorChannel(channel.endpoint, 0, linger_s=0) as survivor:
            survivor.hello(timeout_s=5)
            channel.wait_for_generators(1, timeout_s=5)
            t.lose([1], "killed")
            survivor.send(group)  # the survivor's rollouts, while training waits
            joined: list[float] = []

            def replacement() -> None:
                with GeneratorChannel(channel.endpoint, 1, linger_s=0) as generator:
                    time.sleep(1.5)  # its engine starting
                    generator.hello(timeout_s=5)
                    next_of(generator, Start)
                    joined.append(time.monotonic())
                    generator.send(Ready(generator=1))
                    next_of(generator, Regroup)
                    time.sleep(1.0)  # connected until the trainer took the batch

            with ThreadPoolExecutor(1) as pool:
                started = pool.submit(replacement)
                assert t.take(1) == [group]  # only once the pool is back to 2
                took = time.monotonic()
                started.result(timeout=10)
    assert took >= joined[0]
    assert t.pool.members == [0, 1]
    degraded = [(s, reason) for type_, s, reason in t.status.written if type_ == "Degraded"]
    assert degraded == [(True, "BelowMinReplicas"), (False, "GeneratorsReady")]
    assert conditions(tmp_path)["Degraded"]["status"] == "False"


def test_a_pool_below_min_replicas_past_the_startup_timeout_fails_the_gang(
    tmp_path: Path,
) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    with_generators(t, replicas=2, min_replicas=2)
    t.env = dataclasses.replace(t.env, peer_timeout_s=5.0, startup_timeout_s=1.0)
    with (
        TrainerChannel("tcp://127.0.0.1:*") as channel,
        GeneratorChannel(channel.endpoint, 0, linger_s=0) as survivor,
    ):
        t.channel = channel
        t.pool = Pool(desired=2, members=[0])
        survivor.hello(timeout_s=5)
        channel.wait_for_generators(1, timeout_s=5)
        with pytest.raises(PeerError, match=r"1 of 2 generators ready for \d+ s, below "
                           r"generators.minReplicas 2 \(the startup timeout\)"):  # fmt: skip
            t.take(1)


def test_at_or_above_min_replicas_a_short_pool_trains_on_and_says_so(tmp_path: Path) -> None:
    """The default minReplicas 1: a lost generator's share goes to the others (GeneratorsShort);
    scaled up past what runs, the same."""
    t = trainer(tmp_path, no_signal_steps=3)
    with_generators(t, replicas=2, min_replicas=1)
    t.status = Recorded(tmp_path)
    t.pool = Pool(desired=2, members=[0])
    t.report_pool()
    assert t.minimum() == 1
    t.follow(1)  # scaled down to what runs
    t.follow(3)
    degraded = [(s, reason) for type_, s, reason in t.status.written if type_ == "Degraded"]
    assert degraded == [(True, "GeneratorsShort"), (False, "GeneratorsReady"),
                        (True, "GeneratorsShort")]  # fmt: skip


@contextmanager
def two_generators(t: Any) -> Iterator[tuple[GeneratorChannel, GeneratorChannel]]:
    """Trainer `t` with a pool of two connected generators, both said hello."""
    with (
        TrainerChannel("tcp://127.0.0.1:*") as channel,
        GeneratorChannel(channel.endpoint, 0, linger_s=0) as zero,
        GeneratorChannel(channel.endpoint, 1, linger_s=0) as one,
    ):
        t.channel = channel
        zero.hello(timeout_s=5)
        one.hello(timeout_s=5)
        channel.wait_for_generators(2, timeout_s=5)
        t.pool = Pool.of(2)
        yield zero, one


def test_a_generator_that_stops_answering_is_given_up_while_the_others_train_on(
    tmp_path: Path, make_group: Any
) -> None:
    """Generator 1 stays connected and sends nothing (a hung engine, a SIGSTOPped process)
    while generator 0 sends its rollouts: after the peer timeout generator 1 is lost, told so
    (Stop, lost: an awake process exits failed and is replaced), its supervisor asked to end
    the process that said hello (status: gave-up.jsonl, which the local runner reads), and
    generator 0 takes the whole batch."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.env = dataclasses.replace(t.env, peer_timeout_s=1.0)
    t.publisher = NoWeights()  # type: ignore[assignment]
    first, second = make_group([1.0, 0.0]), make_group([0.0, 1.0], seed=1)
    with two_generators(t) as (working, hung):

        def generator_0() -> None:
            working.send(first)
            next_of(working, Regroup)  # the pool formed again without generator 1
            working.send(second)

        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(generator_0)
            assert t.collect(2) == [first, second]
            sending.result(timeout=10)
        told = next_of(hung, Stop)
    # The silence it was given up after: past the 1 s peer timeout, by however long the loaded
    # machine took to look (a full suite once read 2 s).
    silent = re.search(r"no rollouts for (\d+) s \(the peer timeout\)", told.reason)
    assert told.lost and silent is not None and int(silent[1]) >= 1, told.reason
    assert t.pool.members == [0]
    gave_up = [json.loads(line) for line in (tmp_path / "gave-up.jsonl").read_text().splitlines()]
    assert gave_up == [{"role": "generator-1", "pid": os.getpid(), "host": socket.gethostname(),
                        "reason": gave_up[0]["reason"]}]  # fmt: skip


def test_a_pool_that_all_went_quiet_is_the_trainer_s_problem_not_a_generator_s(
    tmp_path: Path,
) -> None:
    """Every member silent: no generator is singled out; the gang restarts (the trainer, or the
    run's data, may be what is wrong)."""
    t = trainer(tmp_path, no_signal_steps=3)
    t.env = dataclasses.replace(t.env, peer_timeout_s=0.5)
    with two_generators(t):
        with pytest.raises(PeerError, match=r"\(the peer timeout\)"):
            t.collect(1)
    assert t.pool.members == [0, 1]
    assert not (tmp_path / "gave-up.jsonl").exists()
