"""The ZeroMQ channel between real generator processes and the trainer: delivery, timeouts and
backpressure."""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time

import msgpack
import pytest
import zmq

from scalerl.errors import InputError, PeerError
from scalerl.rollout import (
    Failure,
    GeneratorChannel,
    RolloutGroup,
    Sample,
    Stop,
    TrainerChannel,
    UpdateWeights,
    encode,
)

LOCAL = "tcp://127.0.0.1:*"


def group(generator: int, index: int, tokens: int = 4) -> RolloutGroup:
    sample = Sample(
        list(range(tokens)), [-1.0] * tokens, [0] * tokens, [1] * tokens, 1.0, False, False, "stop"
    )
    return RolloutGroup(f"{generator}/{index}", [7, 8], [sample], generator)


def unused_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def generator_process(endpoint: str, index: int) -> None:
    """A generator's loop in miniature: hello, rollouts, a weight update, stop."""
    with GeneratorChannel(endpoint, index) as channel:
        channel.hello(timeout_s=10)
        for i in range(3):
            channel.send(group(index, i), timeout_s=10)
        while True:
            command = channel.recv(timeout_s=10)
            if isinstance(command, UpdateWeights):
                channel.send(Failure(index, f"version {command.version}"), timeout_s=10)
            elif isinstance(command, Stop):
                return
            else:
                raise SystemExit(f"unexpected command {command!r}")


def test_generator_processes_and_trainer_talk_both_ways() -> None:
    ctx = mp.get_context("spawn")
    with TrainerChannel(LOCAL) as trainer:
        procs = [ctx.Process(target=generator_process, args=(trainer.endpoint, i)) for i in (0, 1)]
        for proc in procs:
            proc.start()
        try:
            assert trainer.wait_for_generators(2, timeout_s=20) == {0, 1}
            rollouts = [trainer.recv(timeout_s=10) for _ in range(6)]
            trainer.broadcast(UpdateWeights(version=5))
            replies = [trainer.recv(timeout_s=10) for _ in range(2)]
            trainer.broadcast(Stop("done"))
            for proc in procs:
                proc.join(timeout=10)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    ids = sorted(
        (got[0], got[1].prompt_id) for got in rollouts if got and isinstance(got[1], RolloutGroup)
    )
    assert ids == [(g, f"{g}/{i}") for g in (0, 1) for i in range(3)]
    assert sorted(replies, key=repr) == [(g, Failure(g, "version 5")) for g in (0, 1)]


def say_hello(endpoint: str, index: int) -> None:
    with GeneratorChannel(endpoint, index) as channel:
        channel.hello(timeout_s=5)


def test_messages_sent_while_waiting_for_hellos_are_kept() -> None:
    with TrainerChannel(LOCAL) as trainer, GeneratorChannel(trainer.endpoint, 0) as first:
        first.hello(timeout_s=5)
        first.send(group(0, 0), timeout_s=5)
        late = threading.Timer(0.3, say_hello, args=(trainer.endpoint, 1))
        late.start()
        assert trainer.wait_for_generators(2, timeout_s=5) == {0, 1}
        late.join()
        got = trainer.recv(timeout_s=1)
        assert got is not None and got[0] == 0 and got[1] == group(0, 0)


def test_recv_timeout_returns_none_on_both_ends() -> None:
    with TrainerChannel(LOCAL) as trainer, GeneratorChannel(trainer.endpoint, 0) as generator:
        started = time.monotonic()
        assert trainer.recv(timeout_s=0.2) is None
        assert generator.recv(timeout_s=0.2) is None
        assert 0.35 < time.monotonic() - started < 2


def test_slow_trainer_blocks_the_generator_then_raises_peer_error() -> None:
    with TrainerChannel(LOCAL, max_in_flight=1) as trainer:  # never reads
        with GeneratorChannel(trainer.endpoint, 0, max_in_flight=1, linger_s=0) as generator:
            big = group(0, 0, tokens=50_000)  # ~350 kB, so socket buffers fill quickly
            sent = 0
            with pytest.raises(PeerError) as caught:
                while sent < 200:
                    started = time.monotonic()
                    generator.send(big, timeout_s=0.5)
                    sent += 1
            blocked = time.monotonic() - started
    print(f"{sent} messages of {len(encode(big))} bytes were in flight before send blocked")
    assert 0 < sent < 200  # bounded: only a few messages fit in flight
    assert 0.45 < blocked < 3
    assert f"trainer at {trainer.endpoint} not reachable for 0.5 s" in str(caught.value)


def test_try_send_never_blocks_and_reports_a_full_queue() -> None:
    with TrainerChannel(LOCAL, max_in_flight=1) as trainer:  # never reads
        with GeneratorChannel(trainer.endpoint, 0, max_in_flight=1, linger_s=0) as generator:
            generator.hello(timeout_s=5)
            big = group(0, 0, tokens=50_000)
            started = time.monotonic()
            results = [generator.try_send(big) for _ in range(200)]
            assert time.monotonic() - started < 5
            accepted = results.count(True)
            # ZeroMQ's I/O thread keeps moving queued messages into the socket's buffers while we
            # send, so a refused send may be followed by an accepted one: only "some of each".
            assert 0 < accepted < 200
            got = [trainer.recv(timeout_s=5) for _ in range(accepted + 1)]
            assert [m for _, m in got if m is not None][1:] == [big] * accepted


def test_absent_trainer_makes_send_raise_after_its_timeout() -> None:
    endpoint = unused_endpoint()
    with GeneratorChannel(endpoint, 3, linger_s=0) as generator:
        started = time.monotonic()
        with pytest.raises(PeerError, match=f"trainer at {endpoint} not reachable for 0.3 s"):
            generator.hello(timeout_s=0.3)
        assert time.monotonic() - started < 2


def test_trainer_refuses_to_send_to_an_unknown_or_stalled_generator() -> None:
    with TrainerChannel(LOCAL, max_in_flight=1) as trainer:
        with pytest.raises(PeerError, match="generator 9 is not connected"):
            trainer.send(9, Stop("x"))
        with GeneratorChannel(trainer.endpoint, 0, max_in_flight=1, linger_s=0) as generator:
            generator.hello(timeout_s=5)
            assert trainer.wait_for_generators(1, timeout_s=5) == {0}
            with pytest.raises(PeerError, match="generator 0 took no message"):
                for _ in range(200):  # the generator never reads
                    trainer.send(0, group(0, 0, tokens=50_000), timeout_s=0.3)


def test_missing_generators_are_named_when_waiting_times_out() -> None:
    with TrainerChannel(LOCAL) as trainer, GeneratorChannel(trainer.endpoint, 1) as generator:
        generator.hello(timeout_s=5)
        with pytest.raises(PeerError, match=r"only 1 of 3 generators said hello .*: \[1\]"):
            trainer.wait_for_generators(3, timeout_s=0.5)


def test_unknown_message_type_on_the_wire_is_rejected() -> None:
    with TrainerChannel(LOCAL) as trainer:
        context = zmq.Context()
        rogue = context.socket(zmq.DEALER)
        rogue.setsockopt(zmq.IDENTITY, b"2/00ff")
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(trainer.endpoint)
        rogue.send(msgpack.packb({"type": "launch_missiles"}))
        try:
            with pytest.raises(InputError, match="unknown message type 'launch_missiles'"):
                trainer.recv(timeout_s=5)
        finally:
            rogue.close()
            context.term()


def test_close_does_not_hang_with_undelivered_messages() -> None:
    generator = GeneratorChannel(unused_endpoint(), 0, linger_s=0.2)
    trainer = TrainerChannel(LOCAL, linger_s=0.2)
    started = time.monotonic()
    generator.close()
    trainer.close()
    trainer.close()  # twice is fine
    assert time.monotonic() - started < 2


def test_a_replacement_process_is_another_peer_under_the_same_index() -> None:
    """A generator's replacement says hello under the dead one's index. Until the trainer has
    read that hello, a send for the index is meant for the process that died: it fails at once,
    even though the replacement is connected. From the hello on, sends reach the replacement,
    and what the replaced process still sends is dropped."""
    with TrainerChannel(LOCAL) as trainer:
        first = GeneratorChannel(trainer.endpoint, 1, linger_s=0)
        first.hello(timeout_s=5)
        assert trainer.wait_for_generators(1, timeout_s=5) == {1}
        first.close()  # its process died
        with GeneratorChannel(trainer.endpoint, 1, linger_s=0) as replacement:
            replacement.hello(timeout_s=5)
            time.sleep(0.5)  # connected, its hello waiting unread at the trainer
            with pytest.raises(PeerError, match="generator 1 is not connected"):
                trainer.send(1, UpdateWeights(version=3))
            assert trainer.generators == set()
            assert trainer.wait_for_generators(1, timeout_s=5) == {1}
            trainer.send(1, UpdateWeights(version=4))
            assert replacement.recv(timeout_s=5) == UpdateWeights(version=4)

            # Two processes of one index at once (the old one not yet gone): the newer hello wins.
            with GeneratorChannel(trainer.endpoint, 1, linger_s=0) as newer:
                newer.hello(timeout_s=5)
                got = trainer.recv(timeout_s=5)
                assert got is not None and got[0] == 1
                replacement.send(group(1, 0), timeout_s=5)  # from the replaced process: dropped
                newer.send(group(1, 1), timeout_s=5)
                assert trainer.recv(timeout_s=5) == (1, group(1, 1))
                assert trainer.recv(timeout_s=0.5) is None
                trainer.send(1, Stop("done"))
                assert newer.recv(timeout_s=5) == Stop("done")
                assert replacement.recv(timeout_s=0.5) is None
