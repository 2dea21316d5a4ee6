"""The rollout stream with the run's CURVE keys: the run's generators get in, nobody else does."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq

from scalerl.errors import InputError, PeerError
from scalerl.rollout import GeneratorChannel, RolloutGroup, Sample, TrainerChannel, encode
from scalerl.rollout.keys import (
    ALL_FILES,
    CLIENT_SECRET,
    GENERATOR_FILES,
    SERVER_SECRET,
    TRAINER_FILES,
    StreamKeys,
)

LOCAL = "tcp://127.0.0.1:*"


def rollout(generator: int) -> RolloutGroup:
    sample = Sample([1, 2], [-1.0, -1.0], [0, 0], [1, 1], 1.0, False, False, "stop")
    return RolloutGroup(f"{generator}/0", [7], [sample], generator)


@pytest.fixture
def run_keys(tmp_path: Path) -> Path:
    StreamKeys.generate().write(tmp_path / "keys")
    return tmp_path / "keys"


def test_a_generator_with_the_run_keys_streams_rollouts(run_keys: Path) -> None:
    trainer_keys = StreamKeys.load(run_keys, TRAINER_FILES)
    generator_keys = StreamKeys.load(run_keys, GENERATOR_FILES)
    with (
        TrainerChannel(LOCAL, keys=trainer_keys) as trainer,
        GeneratorChannel(trainer.endpoint, 0, keys=generator_keys) as generator,
    ):
        generator.hello(timeout_s=10)
        generator.send(rollout(0), timeout_s=10)
        assert trainer.wait_for_generators(1, timeout_s=10) == {0}
        got = trainer.recv(timeout_s=10)
    assert got is not None and got[1] == rollout(0)


def raw_peer(endpoint: str, keys: StreamKeys | None) -> tuple[zmq.Context, zmq.Socket]:
    """A stranger on the network: a plain DEALER that pushes a rollout without waiting."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"0")
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys["server.public"])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys["client.public"])
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys[CLIENT_SECRET])
    sock.connect(endpoint)
    sock.send(encode(rollout(0)))
    return context, sock


@pytest.mark.parametrize(
    "stranger", ["no keys", "another run's keys", "the server key but its own client pair"]
)
def test_a_peer_without_the_run_key_is_refused_and_nothing_reaches_a_batch(
    run_keys: Path, stranger: str
) -> None:
    ours = StreamKeys.load(run_keys, ALL_FILES)
    theirs = {
        "no keys": None,
        "another run's keys": StreamKeys.generate(),
        # The server's public key is not a secret: knowing it must not be enough.
        "the server key but its own client pair": StreamKeys(
            {**StreamKeys.generate().keys, "server.public": ours["server.public"]}
        ),
    }[stranger]
    with TrainerChannel(LOCAL, keys=StreamKeys.load(run_keys, TRAINER_FILES)) as trainer:
        context, sock = raw_peer(trainer.endpoint, theirs)
        try:
            assert trainer.recv(timeout_s=1.0) is None
            assert trainer.generators == set()
            # The run's own generator still gets through afterwards.
            with GeneratorChannel(
                trainer.endpoint, 1, keys=StreamKeys.load(run_keys, GENERATOR_FILES)
            ) as generator:
                generator.send(rollout(1), timeout_s=10)
                got = trainer.recv(timeout_s=10)
                assert got is not None and got[0] == 1
                assert trainer.recv(timeout_s=0.5) is None  # still nothing from the stranger
        finally:
            sock.close()
            context.term()


def test_a_generator_without_keys_cannot_reach_a_keyed_trainer(run_keys: Path) -> None:
    with (
        TrainerChannel(LOCAL, keys=StreamKeys.load(run_keys, TRAINER_FILES)) as trainer,
        GeneratorChannel(trainer.endpoint, 0, linger_s=0) as generator,
    ):
        with pytest.raises(PeerError, match="not reachable"):
            generator.send(rollout(0), timeout_s=1.0)
        assert trainer.recv(timeout_s=0.5) is None


def test_keys_are_written_for_their_owner_only_and_each_side_reads_its_own(run_keys: Path) -> None:
    for name in ALL_FILES:
        assert stat.S_IMODE((run_keys / name).stat().st_mode) == 0o600
    generator_side = StreamKeys.load(run_keys, GENERATOR_FILES)
    assert SERVER_SECRET not in generator_side.keys


def test_a_missing_or_bad_key_file_is_named(run_keys: Path) -> None:
    (run_keys / SERVER_SECRET).unlink()
    with pytest.raises(InputError, match="server.secret"):
        StreamKeys.load(run_keys, TRAINER_FILES)
    (run_keys / CLIENT_SECRET).write_text("short")
    with pytest.raises(InputError, match="client.secret.*40-character"):
        StreamKeys.load(run_keys, GENERATOR_FILES)
