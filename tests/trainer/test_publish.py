"""Handing a version to the generators over the real channel: a member whose process is gone
breaks the broadcast as a weight-sync failure (which an elastic trainer recovers from by forming
the group anew), not as an error that ends the trainer."""

from __future__ import annotations

import time

import pytest
import zmq

from scalerl.errors import WeightSyncError
from scalerl.rollout import GeneratorChannel, TrainerChannel
from scalerl.trainer.publish import BroadcastPublisher


class NoWeights:
    def send(self, weights: object, version: int) -> None:
        raise AssertionError("no weights go out once a member is gone")


def wait_until_refused(channel: TrainerChannel, generator: int) -> None:
    """ZeroMQ tears a closed peer's route down in its own thread, a moment after the close (on a
    loaded machine, after the next send): until then a send to it is queued and dropped, not
    refused. Probed below the channel, which would forget the route on the first refusal."""
    identity = channel._routes[generator]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            channel._socket.send_multipart([identity, b""], zmq.NOBLOCK)
        except zmq.ZMQError as err:
            if err.errno == zmq.EHOSTUNREACH:
                return
        time.sleep(0.01)
    raise AssertionError(f"ZeroMQ still routes to generator {generator} 10 s after it closed")


def test_a_member_gone_since_the_group_formed_fails_the_publish_as_a_weight_sync_error() -> None:
    with TrainerChannel("tcp://127.0.0.1:*") as channel:
        with GeneratorChannel(channel.endpoint, 1, linger_s=0) as generator:
            generator.hello(timeout_s=5)
            assert channel.wait_for_generators(1, timeout_s=5) == {1}
        # generator 1's process ended (its socket closed): ZeroMQ no longer routes to it
        wait_until_refused(channel, 1)
        publisher = BroadcastPublisher("127.0.0.1", 0, 1.0)
        publisher.channel, publisher.sender = channel, NoWeights()  # type: ignore[assignment]
        publisher.members = [1]
        gone = "version 3 not sent: generator 1 is not connected"
        with pytest.raises(WeightSyncError, match=gone):
            publisher.publish(policy=None, version=3)  # type: ignore[arg-type]
