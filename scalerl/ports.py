"""Local TCP ports for listeners that another process binds later: a local run's rollout stream,
stores and `/metrics`, and the tests' own servers.

Binding port 0 and closing the socket hands out a port of the kernel's ephemeral range, which any
outgoing connection may take as its source port before the listener binds it: a rare
EADDRINUSE. Ports are therefore drawn below that range, checked bindable, and never handed out
twice by one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

from scalerl.errors import PeerError

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()


def port_range() -> tuple[int, int]:
    """[low, high) of the ports handed out: from 10000 up to the kernel's ephemeral range."""
    try:
        floor = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        floor = 32768  # Linux's default
    return 10000, max(floor, 12000)


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
