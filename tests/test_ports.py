"""Ports for listeners bound later by another process: below the ephemeral range, free, and never
handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl import ports
from scalerl.errors import InputError
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
    monkeypatch.delenv(ports.RANGE_VARIABLE, raising=False)
    with pytest.raises(ports.PeerError, match=r"no free TCP port on 127.0.0.1 in \[10000, "):
        free_port()


# --- SCALERL_PORT_RANGE: disjoint ranges for processes that draw at the same time ---------------


def test_the_variable_confines_every_port_to_its_range(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = ports.default_range()
    part = ports.split_range(1, 3)
    monkeypatch.setenv(ports.RANGE_VARIABLE, part)
    start, end = (int(x) for x in part.split("-"))
    assert port_range() == (start, end) and low < start < end < high
    given = [free_port() for _ in range(50)]
    assert all(start <= p < end for p in given)


@given(
    st.integers(1, 65535).flatmap(lambda low: st.tuples(st.just(low), st.integers(low + 1, 65536)))
)
def test_a_range_reads_back_as_written(bounds: tuple[int, int]) -> None:
    low, high = bounds
    assert ports.parse_range(f"{low}-{high}") == (low, high)


@pytest.mark.parametrize("text", ["20000", "20000-20000", "21000-20000", "0-10", "a-b", "1-65537"])
def test_a_bad_range_is_an_input_error_naming_the_variable(text: str) -> None:
    with pytest.raises(InputError, match=r"SCALERL_PORT_RANGE=.*expected LOW-HIGH"):
        ports.parse_range(text)


@given(st.integers(1, 16), st.integers(1024, 40000), st.integers(16, 20000))
def test_the_parts_of_a_range_are_disjoint_and_inside_it(count: int, low: int, size: int) -> None:
    whole = (low, low + size)
    parts = [ports.parse_range(ports.split_range(i, count, whole)) for i in range(count)]
    for (a_low, a_high), (b_low, _) in zip(parts, parts[1:], strict=False):
        assert a_low < a_high <= b_low  # in order, not overlapping
    assert parts[0][0] == low and parts[-1][1] <= low + size
    assert all(high - low_ >= size // count for low_, high in parts)
