"""Local TCP ports for listeners that another process binds later: a local run's rollout stream,
stores and `/metrics`, and the tests' own servers.

Binding port 0 and closing the socket hands out a port of the kernel's ephemeral range, which any
outgoing connection may take as its source port before the listener binds it: a rare
EADDRINUSE. Ports are therefore drawn below that range, checked bindable, and never handed out
twice by one process.

Processes that draw at the same time can each be handed a port the other has not bound yet:
`SCALERL_PORT_RANGE=LOW-HIGH` (inherited by the processes a run starts) confines one group of
processes to [LOW, HIGH), so that groups given disjoint ranges never share a port; the test suite
gives each of its parallel workers one.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

from scalerl.errors import InputError, PeerError

RANGE_VARIABLE = "SCALERL_PORT_RANGE"
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()


def port_range() -> tuple[int, int]:
    """[low, high) of the ports handed out: $SCALERL_PORT_RANGE, else from 10000 up to the
    kernel's ephemeral range."""
    given = os.environ.get(RANGE_VARIABLE)
    if given:
        return parse_range(given)
    return default_range()


def default_range() -> tuple[int, int]:
    """From 10000 up to the kernel's ephemeral range (at least to 12000)."""
    try:
        floor = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        floor = 32768  # Linux's default
    return 10000, max(floor, 12000)


def parse_range(text: str) -> tuple[int, int]:
    """`LOW-HIGH` as [low, high): 1 <= low < high <= 65536."""
    low_text, dash, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low = high = 0
    if not dash or not 1 <= low < high <= 65536:
        raise InputError(
            f"{RANGE_VARIABLE}={text!r}: expected LOW-HIGH, ports [LOW, HIGH) with "
            "1 <= LOW < HIGH <= 65536 (e.g. 20000-21000)"
        )
    return low, high


def split_range(index: int, count: int, whole: tuple[int, int] | None = None) -> str:
    """The `index`-th of `count` disjoint equal parts of `whole` (default: the default range),
    as SCALERL_PORT_RANGE writes it."""
    low, high = whole or default_range()
    if not 0 <= index < count or count > high - low:
        raise InputError(f"no part {index} of {count} of the ports [{low}, {high})")
    size = (high - low) // count
    return f"{low + index * size}-{low + (index + 1) * size}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range, new to this process."""
    low, high = port_range()
    with _lock:
        for _ in range(1000):
            port = _rng.randrange(low, high)
            if port not in _given and bindable(port, host):
                _given.add(port)
                return port
    raise PeerError(f"no free TCP port on {host} in [{low}, {high}) after 1000 tries")


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
