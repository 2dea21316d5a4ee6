"""How long the trainer waits for rollouts: the peer timeout while a generator is left to deliver
them; with every generator lost (a pool of one whose generator was killed), as long as its
replacement may take to start (it loads its model and engine first): the startup timeout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_signal import trainer

from scalerl.errors import PeerError
from scalerl.rollout import GeneratorChannel, TrainerChannel
from scalerl.trainer.pool import Pool


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
