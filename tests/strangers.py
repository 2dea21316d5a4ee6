"""A stranger at an authenticated store's port (the weight-sync store, the trainer ranks'
store): what it gets when it speaks to the port as torch's TCPStore client, or as a CURVE client
holding another run's keys."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from scalerl.rollout.keys import StreamKeys
from scalerl.sync.store import KeyedStore


def stranger_calls(port: int, keys: StreamKeys | None) -> list[str]:
    """What a stranger at the store's port gets: with no keys a plain TCP client (as it would
    speak to a TCPStore), with keys of its own a CURVE client of another run."""
    outcomes = []
    if keys is None:
        try:
            store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=1))
            store.set("scalerl/sync/joined/1", "1")
            outcomes.append("wrote")
        except Exception as err:  # the CURVE server never completes torch's handshake
            outcomes.append(f"refused: {type(err).__name__}")
        return outcomes
    intruder = KeyedStore.connect("127.0.0.1", port, keys, timeout_s=1.5)
    for attempt in (lambda: intruder.num_keys(), lambda: intruder.set("scalerl/sync/x", "1")):
        try:
            attempt()
            outcomes.append("answered")
        except TimeoutError:
            outcomes.append("no answer")
    intruder.close()
    return outcomes
