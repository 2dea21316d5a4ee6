"""The weight-sync group meets through the run's authenticated store: its peers form the group
and broadcast through it, and a stranger with the address and port can neither read nor write a
key, take a rank's place, nor stop the run's group from forming and broadcasting."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import zmq
from strangers import stranger_calls

from scalerl.errors import WeightSyncError
from scalerl.ports import free_port
from scalerl.rollout.keys import GENERATOR_FILES, TRAINER_FILES, StreamKeys
from scalerl.sync import WeightReceiver, WeightSender, connect
from scalerl.sync.store import KeyedStore

RUN_KEYS = StreamKeys.generate()
TRAINER_KEYS = StreamKeys({name: RUN_KEYS[name] for name in TRAINER_FILES})
GENERATOR_KEYS = StreamKeys({name: RUN_KEYS[name] for name in GENERATOR_FILES})


def test_the_store_behaves_as_torch_expects_of_a_store() -> None:
    port = free_port()
    served = KeyedStore.serve("127.0.0.1", port, TRAINER_KEYS, timeout_s=5)
    client = KeyedStore.connect("127.0.0.1", port, GENERATOR_KEYS, timeout_s=5)
    try:
        client.set("a", "1")
        assert served.get("a") == b"1" and client.check(["a"]) and not client.check(["a", "b"])
        assert served.add("n", 2) == 2 and client.add("n", 3) == 5
        assert client.compare_set("c", "", "x") == b"x"  # absent and expected empty: set
        assert client.compare_set("c", "y", "z") == b"x"  # another value: left alone
        threading.Timer(0.2, lambda: served.set("late", b"here")).start()
        assert client.get("late") == b"here"  # a get waits for its key
        client.wait(["late", "a"], timedelta(seconds=1))
        assert client.num_keys() == 4 and client.delete_key("a") and not client.check(["a"])
        impatient = KeyedStore.connect("127.0.0.1", port, GENERATOR_KEYS, timeout_s=0.3)
        try:
            with pytest.raises(TimeoutError, match="not set within"):
                impatient.get("never")
        finally:
            # An open client goes on reconnecting to this port after the test: it must not
            # greet whatever listens there next (a gloo pair of a later test).
            impatient.close()
    finally:
        client.close()
        served.close()


def test_a_request_sent_again_while_the_server_starts_is_carried_out_once() -> None:
    # A generator may reach trainer 0's port before the store serves it: its client sends the
    # request again every second until answered, and every copy arrives once the server is up.
    # An `add` must count once all the same (ranks count themselves in with it).
    port = free_port()
    client = KeyedStore.connect("127.0.0.1", port, GENERATOR_KEYS, timeout_s=10)
    answers: list[int] = []
    adding = threading.Thread(target=lambda: answers.append(client.add("n", 1)))
    adding.start()
    time.sleep(2.5)  # two copies sent again by now
    served = KeyedStore.serve("127.0.0.1", port, TRAINER_KEYS, timeout_s=5)
    try:
        adding.join(10)
        assert answers == [1]
        time.sleep(0.5)  # any copy still on its way has arrived
        assert served.add("n", 0) == 1
        assert client.add("n", 1) == 2  # the next request is a new one
    finally:
        client.close()
        served.close()


@pytest.mark.parametrize("stranger", ["tcpstore client", "another run's keys"])
def test_a_stranger_at_the_port_cannot_join_and_the_group_forms_and_broadcasts(
    stranger: str,
) -> None:
    port = free_port()
    other = StreamKeys.generate()
    own = (
        None
        if stranger == "tcpstore client"
        else StreamKeys({name: other[name] for name in GENERATOR_FILES})
    )
    results: dict[str, Any] = {}

    def trainer() -> None:
        with connect("127.0.0.1", port, 2, 0, timeout_s=20, keys=TRAINER_KEYS) as group:
            results["stranger"] = stranger_calls(port, own)  # while the group is waiting
            WeightSender(group).send([("w", torch.arange(6.0))], version=7)

    def generator() -> None:
        with connect("127.0.0.1", port, 2, 1, timeout_s=20, keys=GENERATOR_KEYS) as group:
            results["received"] = WeightReceiver(group).receive(timeout_s=20)

    threads = [threading.Thread(target=trainer), threading.Thread(target=generator)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    version, named = results["received"]
    assert version == 7 and torch.equal(dict(named)["w"], torch.arange(6.0))
    # torch's client fails its handshake ping; another run's CURVE client gets no handshake.
    expected = {"tcpstore client": ["refused"], "another run's keys": ["no answer", "no answer"]}
    assert [o.split(":")[0] for o in results["stranger"]] == expected[stranger], results


def test_a_generator_without_the_runs_keys_never_joins() -> None:
    port = free_port()
    other = StreamKeys.generate()
    outsider = StreamKeys({name: other[name] for name in GENERATOR_FILES})
    errors: dict[int, BaseException] = {}

    def rank(r: int, keys: StreamKeys) -> None:
        try:
            connect("127.0.0.1", port, 2, r, timeout_s=3, keys=keys).close()
        except BaseException as err:
            errors[r] = err

    threads = [
        threading.Thread(target=rank, args=(0, TRAINER_KEYS)),
        threading.Thread(target=rank, args=(1, outsider)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert isinstance(errors.get(0), WeightSyncError) and "ranks [1]" in str(errors[0])
    assert isinstance(errors.get(1), WeightSyncError)
    assert zmq.zmq_version_info() >= (4, 0)  # CURVE needs libzmq 4
