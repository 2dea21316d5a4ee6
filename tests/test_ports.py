"""Ports for listeners bound later by another process: below the ephemeral range, free, and never
handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from scalerl import ports
from scalerl.ports import free_port, port_range


def test_ports_come_from_below_the_kernels_ephemeral_range_and_are_never_repeated() -> None:
    low, high = port_range()
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert high <= max(ephemeral, 12000)
    given = [free_port() for _ in range(200)]
    assert len(set(given)) == len(given)
    assert all(low <= p < high for p in given)


class Draws:
    """A stand-in for the random draw: these ports, in this order."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def randrange(self, low: int, high: int) -> int:
        return self.ports.pop(0)


def test_a_port_in_use_or_already_given_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        busy = listener.getsockname()[1]
        free = next(p for p in range(12000, 13000) if p not in ports._given and ports.bindable(p))
        monkeypatch.setattr(ports, "_rng", Draws(busy, taken, free))
        assert free_port() == free


def test_no_free_port_is_an_error_naming_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "bindable", lambda port, host="127.0.0.1": False)
    with pytest.raises(ports.PeerError, match=r"no free TCP port on 127.0.0.1 in \[10000, "):
        free_port()
