"""A Hugging Face Hub on 127.0.0.1 (or `host`) for tests: the routes huggingface_hub 2.4's own
client calls to resolve a revision and download a snapshot, in the Hub's URL layout.

- `GET /api/{models,datasets}/ORG/NAME/revision/REV`: the commit (`sha`) and files (`siblings`).
- `GET /api/{models,datasets}/ORG/NAME/tree/REV?recursive=…`: the commit's files, with sizes.
- `HEAD`/`GET /[datasets/]ORG/NAME/resolve/REV/PATH`: a file, with the headers the client reads
  (`X-Repo-Commit`, `ETag`, `Content-Length`). No Xet headers: the client downloads over HTTP.

Errors as the Hub gives them (status and `X-Error-Code`): a missing repo or revision (404), a
private repo without the token (401), a token it does not know (401, on any repo), a gated repo
(403 GatedRepo), a rate limit (429).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TYPES = {"models": "model", "datasets": "dataset"}


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> path -> bytes
    refs: dict[str, str] = field(default_factory=dict)  # branch -> sha
    access: str = "public"  # public | private (needs the token) | gated (refused)


@dataclass
class FakeHub:
    token: str = "hf_test_token"
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)  # (type, id) -> repo
    rate_limited: bool = False
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, auth
    server: ThreadingHTTPServer | None = None
    # Where it listens: a test kubelet's pods reach the address the API server is served on.
    host: str = "127.0.0.1"

    def push(self, kind: str, repo_id: str, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit of `files` on `branch` (the branch moves to it); its sha."""
        repo = self.repos.setdefault((kind, repo_id), Repo())
        digest = hashlib.sha1(repo_id.encode())
        for path, data in sorted(files.items()):
            digest.update(path.encode() + b"\0" + data)
        digest.update(str(len(repo.commits)).encode())
        sha = digest.hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs[branch] = sha
        return sha

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.server_address[1]}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            owner = hub

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.server.daemon_threads = True
        serve = self.server.serve_forever
        threading.Thread(target=serve, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def downloads(self) -> int:
        """File downloads served so far (GETs of `resolve/`; the API's calls are not counted)."""
        return sum(m == "GET" and "/resolve/" in p for m, p, _ in self.requests)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def blob_oid(data: bytes) -> str:
    """A file's git blob id, as the tree API gives it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    owner: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet tests

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        hub = self.owner
        path = urllib.parse.urlsplit(self.path).path
        hub.requests.append((self.command, path, self.headers.get("Authorization")))
        if hub.rate_limited:
            return self._error(429, None, body)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in TYPES:
            kind, repo_id, action = TYPES[parts[1]], "/".join(parts[2:4]), parts[4]
            rest = [urllib.parse.unquote(p) for p in parts[5:]]
        else:
            kind = "dataset" if parts[0] == "datasets" else "model"
            parts = parts[1:] if parts[0] == "datasets" else parts
            if len(parts) < 5 or parts[2] != "resolve":
                return self._error(404, None, body)
            repo_id, action = "/".join(parts[:2]), "resolve"
            rest = [urllib.parse.unquote(p) for p in parts[3:]]
        auth = self.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {hub.token}":  # the Hub refuses unknown tokens
            message = {"X-Error-Message": "Invalid credentials in Authorization header"}
            return self._error(401, None, body, message)
        repo = hub.repos.get((kind, repo_id))
        if repo is None:
            return self._error(404, "RepoNotFound", body)
        if repo.access == "gated":
            return self._error(403, "GatedRepo", body)
        if repo.access == "private" and self.headers.get("Authorization") != f"Bearer {hub.token}":
            return self._error(401, "RepoNotFound", body)
        self._answer(repo, action, rest, body)

    def _answer(self, repo: Repo, action: str, rest: list[str], body: bool) -> None:
        revision = urllib.parse.unquote(rest[0])
        sha = repo.refs.get(revision, revision)
        files = repo.commits.get(sha)
        if files is None:
            return self._error(404, "RevisionNotFound", body)
        if action == "revision":
            info = {"id": "", "sha": sha, "siblings": [{"rfilename": p} for p in sorted(files)]}
            return self._send(200, json.dumps(info).encode(), {}, body)
        if action == "tree":
            under = "/".join(rest[1:])
            entries = [
                {"type": "file", "oid": blob_oid(data), "size": len(data), "path": p}
                for p, data in sorted(files.items())
                if not under or p.startswith(under + "/")
            ]
            return self._send(200, json.dumps(entries).encode(), {}, body)
        name = "/".join(rest[1:])
        if name not in files:
            return self._error(404, "EntryNotFound", body, {"X-Repo-Commit": sha})
        data = files[name]
        etag = f'"{blob_oid(data)}"'
        self._send(200, data, {"X-Repo-Commit": sha, "ETag": etag}, body)

    def _error(
        self, status: int, code: str | None, body: bool, extra: dict[str, str] | None = None
    ) -> None:
        headers = dict(extra or {})
        if code:
            headers["X-Error-Code"] = code
        message = json.dumps({"error": code or f"HTTP {status}"}).encode()
        self._send(status, message, headers, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
