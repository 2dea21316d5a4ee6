"""The rollout stream's keys: ZeroMQ CURVE, so only the run's own generators reach its trainer.

A run has two key pairs. The trainer's (server) pair encrypts the stream; the generators share
the client pair, and the trainer admits a peer only if it proves it holds the client secret
(checked by a ZAP handler against the client public key). A peer without the keys, or with keys
of another run, gets no handshake: nothing it sends reaches a batch.

On disk (a run directory locally, the run's Secret mounted in a pod) the keys are four Z85 text
files; each side reads only the files it needs, so a generator pod need not hold the server secret.
"""

from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth.thread

from scalerl.errors import InputError

log = logging.getLogger(__name__)

SERVER_PUBLIC = "server.public"
SERVER_SECRET = "server.secret"
CLIENT_PUBLIC = "client.public"
CLIENT_SECRET = "client.secret"
TRAINER_FILES = (SERVER_PUBLIC, SERVER_SECRET, CLIENT_PUBLIC)
GENERATOR_FILES = (SERVER_PUBLIC, CLIENT_PUBLIC, CLIENT_SECRET)
ALL_FILES = (SERVER_PUBLIC, SERVER_SECRET, CLIENT_PUBLIC, CLIENT_SECRET)
_ZAP_DOMAIN = "scalerl"


@dataclass(frozen=True)
class StreamKeys:
    """Z85-encoded CURVE keys, by file name (only those one side needs)."""

    keys: dict[str, bytes]

    @classmethod
    def generate(cls) -> StreamKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(
            {
                SERVER_PUBLIC: server_public,
                SERVER_SECRET: server_secret,
                CLIENT_PUBLIC: client_public,
                CLIENT_SECRET: client_secret,
            }
        )

    @classmethod
    def load(cls, directory: Path, names: tuple[str, ...]) -> StreamKeys:
        """Read the files `names` from `directory`; a missing or malformed one is named."""
        keys = {}
        for name in names:
            path = directory / name
            try:
                key = path.read_bytes().strip()
            except OSError as err:
                raise InputError(f"rollout stream key {path} cannot be read: {err}") from None
            if len(key) != 40:
                raise InputError(f"rollout stream key {path} is not a 40-character Z85 key")
            keys[name] = key
        return cls(keys)

    def write(self, directory: Path) -> None:
        """Each key in a file only its owner can read."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, key in self.keys.items():
            path = directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(key)

    def text(self) -> dict[str, str]:
        """As a Secret's stringData."""
        return {name: key.decode() for name, key in self.keys.items()}

    def __getitem__(self, name: str) -> bytes:
        return self.keys[name]


class ServerAuth:
    """The trainer's side: makes a socket a CURVE server that admits only the client key."""

    def __init__(self, context: zmq.Context[Any], keys: StreamKeys) -> None:
        self._client_public = keys[CLIENT_PUBLIC]
        self._keys = keys
        self._authenticator = zmq.auth.thread.ThreadAuthenticator(context, log=log)
        self._authenticator.start()
        self._authenticator.configure_curve_callback(_ZAP_DOMAIN, credentials_provider=self)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self._keys[SERVER_PUBLIC])
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._keys[SERVER_SECRET])
        # A ZAP domain makes the handshake consult our handler (without one, libzmq admits any
        # client that knows the server's public key).
        sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: called with the client's public key (Z85) for each handshake."""
        allowed = hmac.compare_digest(key, self._client_public)
        if not allowed:
            log.warning("refused a rollout-stream peer with an unknown key")
        return allowed

    def stop(self) -> None:
        self._authenticator.stop()


def apply_client(sock: zmq.Socket[Any], keys: StreamKeys) -> None:
    """A generator's side: a CURVE client that holds the run's client pair."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys[SERVER_PUBLIC])
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys[CLIENT_PUBLIC])
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys[CLIENT_SECRET])
