"""Generations of the weight-sync group over real gloo processes: trainer rank 0 serves one store
for the run; when a receiver dies the trainer's broadcast fails, the group forms again without it
on the same store, and a replacement joins a later generation and gets the same bits."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import PrefixStore

from scalerl.errors import WeightSyncError
from scalerl.ports import free_port
from scalerl.sync import WeightReceiver, WeightSender, connect
from scalerl.sync import group as sync_group
from scalerl.sync.group import RanksMissing, SyncGroup, close_store, serve_meeting

TIMEOUT_S = 60.0


def weights(version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(version)
    return {"a": torch.randn(1000, generator=gen), "b": torch.randn(7, 3, generator=gen)}


def _receiver(port: int, commands: Any, results: Any) -> None:
    """A generator's receiver: joins the generation it is told, receives versions, reports."""
    group: SyncGroup | None = None
    try:
        while True:
            command = commands.get(timeout=TIMEOUT_S)
            if command[0] == "join":
                _, generation, rank, world = command
                if group is not None:
                    group.close()
                try:
                    group = connect("127.0.0.1", port, world, rank, timeout_s=TIMEOUT_S,
                                    generation=generation)  # fmt: skip
                except WeightSyncError as err:
                    group = None
                    results.put(("not joined", generation, str(err)))
                    continue
                results.put(("joined", generation))
            elif command[0] == "receive":
                assert group is not None
                try:
                    version, named = WeightReceiver(group).receive(timeout_s=TIMEOUT_S)
                except WeightSyncError as err:
                    results.put(("failed", str(err)))
                    continue
                expected = weights(version)
                same = [n for n, t in named] == list(expected) and all(
                    torch.equal(t, expected[n]) for n, t in named
                )
                results.put(("received", version, same))
            else:
                return
    except Exception:
        results.put(("error", traceback.format_exc()))


class Receiver:
    def __init__(self, port: int) -> None:
        ctx = mp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=_receiver, args=(port, self.commands, self.results))
        self.process.start()

    def tell(self, *command: Any) -> None:
        self.commands.put(command)

    def answer(self) -> tuple[Any, ...]:
        try:
            got: tuple[Any, ...] = self.results.get(timeout=TIMEOUT_S)
        except queue.Empty:
            pytest.fail("a receiver did not answer")
        assert got[0] != "error", got[1]
        return got

    def stop(self) -> None:
        if self.process.is_alive():
            self.tell("exit")
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def form(store: Any, port: int, generation: int, members: list[Receiver]) -> SyncGroup:
    """Tell each member its rank in `generation`, then form it as rank 0 on the run's store."""
    world = len(members) + 1
    for rank, member in enumerate(members, start=1):
        member.tell("join", generation, rank, world)
    group = connect("127.0.0.1", port, world, 0, timeout_s=TIMEOUT_S, generation=generation,
                    store=store)  # fmt: skip
    assert all(m.answer() == ("joined", generation) for m in members)
    return group


def send(group: SyncGroup, members: list[Receiver], version: int) -> None:
    for member in members:
        member.tell("receive")
    WeightSender(group).send(list(weights(version).items()), version)


def test_a_dead_receiver_breaks_one_broadcast_and_the_next_generation_forms_without_it() -> None:
    port = free_port()
    store = serve_meeting("127.0.0.1", port, None, TIMEOUT_S)
    survivor, doomed, replacement = Receiver(port), Receiver(port), None
    try:
        group = form(store, port, 0, [survivor, doomed])
        send(group, [survivor, doomed], 1)
        assert survivor.answer() == doomed.answer() == ("received", 1, True)

        doomed.process.kill()  # SIGKILL
        doomed.process.join()
        survivor.tell("receive")
        with pytest.raises(WeightSyncError):
            WeightSender(group).send(list(weights(2).items()), 2)
        group.close()  # closing it is what tells a survivor still waiting that nothing comes
        assert survivor.answer()[0] in ("failed", "received")

        group = form(store, port, 1, [survivor])  # the same store: nothing to restart
        send(group, [survivor], 2)
        assert survivor.answer() == ("received", 2, True)

        replacement = Receiver(port)
        group.close()
        group = form(store, port, 2, [survivor, replacement])
        send(group, [survivor, replacement], 3)
        assert survivor.answer() == replacement.answer() == ("received", 3, True)
        group.close()
    finally:
        for r in (survivor, doomed, replacement):
            if r is not None:
                r.stop()
        close_store(store)


def test_a_member_that_never_joins_is_named_by_its_rank() -> None:
    port = free_port()
    store = serve_meeting("127.0.0.1", port, None, TIMEOUT_S)
    member = Receiver(port)
    try:
        member.tell("join", 0, 1, 3)  # rank 2 never comes
        # Once rank 1 has announced itself (a spawned process takes seconds to get there):
        PrefixStore("scalerl/sync/0", store).wait(["joined/1"], timedelta(seconds=TIMEOUT_S))
        with pytest.raises(RanksMissing) as caught:
            connect("127.0.0.1", port, 3, 0, timeout_s=TIMEOUT_S, join_timeout_s=3.0,
                    store=store)  # fmt: skip
        assert caught.value.missing == [2]
    finally:
        member.process.kill()
        member.process.join()
        close_store(store)


def test_a_member_reported_gone_while_the_group_forms_is_not_waited_for() -> None:
    """A generator killed just before a generation forms can still look alive when it is told to
    join; the trainer keeps asking while it waits, and stops at the first answer that it is gone
    rather than waiting out the join timeout."""
    port = free_port()
    store = serve_meeting("127.0.0.1", port, None, TIMEOUT_S)
    asked = []

    def gone() -> list[int]:
        asked.append(True)
        return [1] if len(asked) >= 3 else []  # the third look finds rank 1's process gone

    try:
        with pytest.raises(RanksMissing, match=r"ranks \[1\] are gone") as caught:
            connect("127.0.0.1", port, 2, 0, timeout_s=TIMEOUT_S, join_timeout_s=TIMEOUT_S,
                    store=store, gone=gone)  # fmt: skip
        assert caught.value.missing == [1]
        assert len(asked) == 3
    finally:
        close_store(store)


def test_a_generation_rank_0_gives_up_is_left_by_the_members_waiting_in_it() -> None:
    """A generator killed as a generation forms: the trainer stops waiting for it and forms the
    next generation without it. The survivor, told to join the first, waits for the same dead
    rank; it must leave at once, not after its join timeout, since the trainer waits for it in
    the next (a full run saw the survivor arrive 29.6 s into the trainer's 30 s)."""
    port = free_port()
    store = serve_meeting("127.0.0.1", port, None, TIMEOUT_S)
    survivor = Receiver(port)
    try:
        survivor.tell("join", 1, 1, 3)  # rank 2 was killed as it was told to join
        PrefixStore("scalerl/sync/1", store).wait(["joined/1"], timedelta(seconds=TIMEOUT_S))
        with pytest.raises(RanksMissing, match=r"ranks \[2\] are gone"):
            connect("127.0.0.1", port, 3, 0, timeout_s=TIMEOUT_S, join_timeout_s=TIMEOUT_S,
                    generation=1, store=store, gone=lambda: [2])  # fmt: skip
        # Within the survivor's poll, far inside its TIMEOUT_S join timeout:
        answer = survivor.answer()
        assert answer[:2] == ("not joined", 1)
        assert "rank 0 gave this generation up" in answer[2] and "ranks [2]" in answer[2]
        group = form(store, port, 2, [survivor])
        send(group, [survivor], 1)
        assert survivor.answer() == ("received", 1, True)
        group.close()
    finally:
        survivor.stop()
        close_store(store)


SHORT_MESH_S = 1.0  # sync_group.MESH_S in the test below, shortened


def _dies_as_its_mesh_starts(port: int) -> None:
    """Rank 1 of 2: joins the generation, then dies as it would build gloo's mesh."""
    sync_group._make_backend = lambda *args: os._exit(0)
    connect("127.0.0.1", port, 2, 1, timeout_s=TIMEOUT_S, join_timeout_s=TIMEOUT_S)


def test_a_member_killed_after_it_joined_costs_the_mesh_s_timeout_not_the_join_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A generator killed as its group formed, after it joined: rank 0's mesh waits for it with
    the mesh's own timeout (MESH_S), not what is left of the join's (60 s here). gloo tries a
    connection to a rank that died mid-mesh five times, each for the whole timeout it was given:
    with the 30 s of a rejoin, that held the trainer of a chaos run 150 s."""
    monkeypatch.setattr(sync_group, "MESH_S", SHORT_MESH_S)
    port = free_port()
    doomed = mp.get_context("spawn").Process(target=_dies_as_its_mesh_starts, args=(port,))
    doomed.start()
    try:
        started = time.monotonic()
        with pytest.raises(WeightSyncError, match="could not build the backend") as caught:
            connect("127.0.0.1", port, 2, 0, timeout_s=TIMEOUT_S, join_timeout_s=TIMEOUT_S)
        failed_s = time.monotonic() - started
    finally:
        doomed.join(TIMEOUT_S)
    assert doomed.exitcode == 0  # it joined: the join did not fail, the mesh did
    # The member's start (a spawned process takes seconds to join), then the mesh's timeout:
    assert failed_s < 20 + 5 * SHORT_MESH_S, f"rank 0 failed after {failed_s:.1f} s: {caught.value}"
