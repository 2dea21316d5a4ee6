"""The client side of the emulated cluster: the server thread, kubectl, raw HTTP, kopf.

`Cluster` is what the `k8s` fixture (conftest.py) yields. The emulator runs in a thread with its
own event loop, so that blocking `kubectl` calls, a kopf operator in the test's event loop or in
a thread, and the test itself can all talk to it at once; `Cluster.call` runs code on that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml
from emulator import ApiCall, ApiEmulator
from emulator_patches import MERGE, patcher
from emulator_store import Obj

T = TypeVar("T")
KUBECTL_TIMEOUT = "30s"
WAIT_TIMEOUT = 30.0  # generous: the shared test machines are often loaded
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only


class ServerThread:
    """An event loop in a daemon thread, serving one ApiEmulator over HTTP."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="k8s-api", daemon=True)
        self._exits = contextlib.AsyncExitStack()

    def start(self) -> tuple[ApiEmulator, str]:
        self.thread.start()
        return self.call_async(self._start())

    def call_async(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> tuple[ApiEmulator, str]:
        emulator = await self._exits.enter_async_context(ApiEmulator())
        server = await self._exits.enter_async_context(kmock.Server(emulator, host="127.0.0.1"))
        return emulator, str(server.url).rstrip("/")

    async def _stop(self, emulator: ApiEmulator) -> None:
        emulator.close()
        await self._exits.aclose()

    def stop(self, emulator: ApiEmulator) -> None:
        try:
            self.call_async(self._stop(emulator))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


class LineStream:
    """The stdout of a long-running kubectl (e.g. `get -w`), read line by line with timeouts."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float = WAIT_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"kubectl ended; its output was: {self.lines}")
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"no such line within {timeout}s; the output was: {self.lines}")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def lines(self) -> list[Any]:
        """A watch stream's events."""
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


@dataclass
class OperatorThread:
    """A kopf operator running in its own thread and event loop."""

    stop_flag: threading.Event = field(default_factory=threading.Event)
    ready_flag: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None


class Cluster:
    """What a test gets from the `k8s` fixture."""

    def __init__(self, server: ServerThread, emulator: ApiEmulator, url: str, workdir: Path):
        self.server, self.emulator, self.url = server, emulator, url
        self.kubeconfig = workdir / "kubeconfig"
        self.cache_dir = workdir / "kube-cache"
        self.kubeconfig.write_text(yaml.safe_dump(self._kubeconfig()))
        self._changes = threading.Condition()
        self._change_count = 0
        self.call(emulator.store.listeners.append, self._on_change)

    def _kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "tester", "namespace": "default"},
                }
            ],
        }

    def _on_change(self) -> None:
        with self._changes:
            self._change_count += 1
            self._changes.notify_all()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the emulator's event loop (the emulator is not thread-safe)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self.server.loop.call_soon_threadsafe(run)
        return future.result(30)

    # kubectl.

    def kubectl_argv(self, *args: str) -> list[str]:
        argv = ["kubectl", f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}"]
        if not any(arg.startswith("--request-timeout") for arg in args):
            argv.append(f"--request-timeout={KUBECTL_TIMEOUT}")
        validating = args[:1] in (("apply",), ("create",), ("replace",))
        if validating and not any(arg.startswith("--validate") for arg in args):
            argv.append("--validate=false")  # there is no OpenAPI schema to validate against
        return argv + list(args)

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.kubectl_argv(*args),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(),
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done

    async def kubectl_async(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl without blocking the calling event loop (e.g. kopf running in it)."""
        process = await asyncio.create_subprocess_exec(
            *self.kubectl_argv(*args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env(),
        )
        raw = input.encode() if input is not None else None
        out, err = await asyncio.wait_for(process.communicate(raw), timeout)
        assert process.returncode is not None
        done = subprocess.CompletedProcess(
            list(args), process.returncode, out.decode(), err.decode()
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    @contextlib.contextmanager
    def kubectl_stream(self, *args: str) -> Iterator[LineStream]:
        """A long-running kubectl (`get -w`); killed at exit."""
        process = subprocess.Popen(
            self.kubectl_argv("--request-timeout=0", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self._env(),
        )
        try:
            yield LineStream(process)
        finally:
            process.kill()
            process.wait(10)

    # Raw HTTP.

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = WAIT_TIMEOUT,
    ) -> Reply:
        """One HTTP request to the API (watches need `timeoutSeconds`); errors are replies too."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": accept},
        )
        try:
            with NO_PROXY.open(request, timeout=timeout) as response:
                return Reply(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            return Reply(error.code, dict(error.headers), error.read())

    # Inspection.

    @property
    def requests(self) -> list[ApiCall]:
        return self.call(list, self.emulator.api_calls)

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of a resource (plural, kind, short name, `plural.group`)."""
        return self.call(
            lambda: self.emulator.store.list(self.emulator.catalog.lookup(resource), namespace)
        )

    def get(self, resource: str, name: str, namespace: str | None = "default") -> Obj | None:
        return self.call(
            lambda: self.emulator.store.get(self.emulator.catalog.lookup(resource), namespace, name)
        )

    # Direct writes: applied as the API would, but not recorded in `requests` (test setup).

    def create(self, body: Mapping[str, Any] | str) -> Obj:
        """Create an object from a dict or YAML text (namespace "default" unless given)."""
        obj = yaml.safe_load(body) if isinstance(body, str) else body
        namespace = obj.get("metadata", {}).get("namespace", "default")
        return self.call(
            lambda: self.emulator.store.create(
                self.emulator.catalog.by_kind(obj["apiVersion"], obj["kind"]), namespace, obj
            )
        )

    def patch(
        self,
        resource: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = "default",
        subresource: str | None = None,
    ) -> Obj:
        """Merge-patch an object, e.g. `patch("pods", "p", {"status": …}, subresource="status")`."""
        return self.call(
            lambda: self.emulator.store.update(
                self.emulator.catalog.lookup(resource),
                namespace,
                name,
                patcher(MERGE, patch),
                subresource=subresource,
            )
        )

    def delete(self, resource: str, name: str, *, namespace: str | None = "default") -> Obj:
        return self.call(
            lambda: self.emulator.store.delete(
                self.emulator.catalog.lookup(resource), namespace, name
            )
        )

    def install_crd(self, crd: Mapping[str, Any] | str | Path) -> Obj:
        """Create a CRD from a dict or a YAML file (as `kubectl apply -f` would)."""
        body = crd if isinstance(crd, Mapping) else yaml.safe_load(Path(crd).read_text())
        return self.call(self.emulator.install_crd, body)

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = WAIT_TIMEOUT, message: str = ""
    ) -> T:
        """Wait until `predicate()` is truthy and return it; re-checked on every API write."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changes:
                seen = self._change_count
            value = predicate()
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout}s: {message or predicate}")
            with self._changes:  # API writes wake us; other state is polled every 50 ms
                self._changes.wait_for(
                    lambda seen=seen: self._change_count != seen, min(left, 0.05)
                )

    async def wait_for_async(
        self, predicate: Callable[[], T], timeout: float = WAIT_TIMEOUT, message: str = ""
    ) -> T:
        """As `wait_for`, without blocking the calling event loop (kopf may be running in it)."""
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s: {message or predicate}")
            await asyncio.sleep(0.02)
        return value

    # kopf.

    @contextlib.contextmanager
    def operator(
        self, registry: Any, *, timeout: float = WAIT_TIMEOUT, **options: Any
    ) -> Iterator[OperatorThread]:
        """Run `kopf.operator(registry=…)` in a thread (standalone, cluster-wide by default).

        The registry must have a `@kopf.on.login` handler returning
        `kopf.ConnectionInfo(server=k8s.url, insecure=True)`.
        """
        import kopf

        handle = OperatorThread()
        kwargs = {"standalone": True, "clusterwide": True, **options}

        def run() -> None:
            try:
                asyncio.run(
                    kopf.operator(
                        registry=registry,
                        stop_flag=handle.stop_flag,
                        ready_flag=handle.ready_flag,
                        **kwargs,
                    )
                )
            except BaseException as exc:
                handle.errors.append(exc)

        handle.thread = threading.Thread(target=run, name="kopf-operator", daemon=True)
        handle.thread.start()
        try:
            self.wait_for(
                lambda: handle.ready_flag.is_set() or handle.errors,
                timeout,
                "the operator to start",
            )
            yield handle
        finally:
            handle.stop_flag.set()
            handle.thread.join(timeout)
        assert not handle.thread.is_alive(), "the operator did not stop"
        assert not handle.errors, f"the operator failed: {handle.errors!r}"
