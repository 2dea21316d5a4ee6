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
