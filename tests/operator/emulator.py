"""A Kubernetes API for tests that both kopf and kubectl work against: kmock's emulator, extended.

kmock 0.8's `KubernetesEmulator` stores objects and serves create/get/list/watch/patch/delete.
A real operator and a real kubectl need more of an API server, so `ApiEmulator` adds:

- server-assigned `metadata.uid`, `creationTimestamp`, `generation` (bumped only when more than
  metadata/status changes) and a global `resourceVersion` bumped on every write; no-op writes
  change nothing. Without these kopf runs create handlers twice and its finalizer JSON-patch
  (which tests `resourceVersion`) loops;
- watches from `?resourceVersion=` (a replayable change log), `?timeoutSeconds=`, served as
  `application/json` (kubectl refuses octet-stream); lists with `<Kind>List`, `apiVersion` and
  the list's resourceVersion; label and field selectors on list/watch/deletecollection;
- discovery built from a catalog of built-in kinds and learned CRDs (core `groupVersion: "v1"`,
  short names, categories, verbs, the status subresource), so kubectl maps `wd` and kopf finds
  resources; `/api/v1/namespaces` and Namespace objects;
- status-subresource semantics (writes to `/status` change only `.status`, others all but it),
  merge, strategic-merge (approximate), JSON (a failed `test` is 422) and apply patches, PUT,
  `generateName`, `dryRun`;
- DELETE with preconditions and `propagationPolicy`, finalizers, owner-reference garbage
  collection (cascading; Orphan strips the references), namespace and CRD deletion;
- `meta.k8s.io/v1` Table responses from a CRD's `additionalPrinterColumns`, so `kubectl get`
  shows the custom columns (also in `get -w`);
- `api_calls`: every request as (method, path, query, RBAC verb, resource) for counting writes
  and comparing an operator's verbs with its RBAC rules.

User reactions of kmock's DSL (`emulator['patch', kmock.resource(...)] << 500`) still take
precedence over the emulated responses; like kmock, the emulator applies writes regardless.
Not emulated: schema validation and defaulting, admission, controllers (pods never run: tests
set their status), server-side apply's field ownership, authentication and authorization.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
from emulator_catalog import (
    Catalog,
    ResourceType,
    api_versions_doc,
    group_doc,
    group_list_doc,
    resource_list_doc,
)
from emulator_patches import APPLY, PatchError, UnsupportedPatchType, patcher
from emulator_query import Predicate, SelectorError, field_selector, label_selector
from emulator_requests import ApiCall, api_call, parse_api_path, parse_request, rbac_verb
from emulator_store import Change, Obj, Store, api_error, bad_request
from emulator_tables import table, wants_table
from kmock._internal import rendering  # Response has no public constructor


@dataclass(frozen=True)
class Route:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _header(request: kmock.Request, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")


@attrs.define(kw_only=True)
class ApiEmulator(kmock.KubernetesEmulator):
    clock: Callable[[], datetime.datetime] = _utcnow
    catalog: Catalog = attrs.field(factory=Catalog.with_builtins)
    store: Store = attrs.field(init=False)
    api_calls: list[ApiCall] = attrs.field(factory=list, init=False)
    failures: list[BaseException] = attrs.field(factory=list, init=False)
    _outcomes: dict[int, Any] = attrs.field(factory=dict, init=False)
    _tick: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_outcome  # replace: no kmock action
        self.fallback[kmock.method.DELETE] << self._serve_outcome  # deletecollection: ditto
        self.store = Store(objects=self.objects, catalog=self.catalog, clock=self.clock)
        self.store.listeners.append(self._notify)
        namespaces = self.catalog.lookup("namespaces")
        self.store.create(namespaces, None, {"metadata": {"name": "default"}})

    # Public helpers (call them on the server's event loop).

    def install_crd(self, crd: Mapping[str, Any]) -> Obj:
        """Create (or replace the spec of) a CustomResourceDefinition, as `kubectl apply` would."""
        crds = self.catalog.lookup("customresourcedefinitions")
        existing = self.store.get(crds, None, crd.get("metadata", {}).get("name", ""))
        if existing is None:
            return self.store.create(crds, None, crd)
        return self.store.update(
            crds, None, existing["metadata"]["name"], lambda obj: {**obj, "spec": crd["spec"]}
        )

    def close(self) -> None:
        """End all watch streams, so that the HTTP server can stop at once."""
        self._closing = True
        self._notify()

    def _notify(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    # Request handling.

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        request = await parse_request(raw, id=len(self._requests))
        self._requests.append(request)
        self.api_calls.append(call := api_call(request))
        response = await self._respond(request)
        call.status = response.status
        return response

    async def _respond(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            return await self._handle(request)
        except rendering.StreamingError as exc:  # the stream had begun: report the error in it
            response: aiohttp.web.StreamResponse = exc.args[0]
            await self._stream_error(exc.__cause__ or exc, response)
            await response.write_eof()
            return response
        except Exception as exc:
            return await self._render_error(exc)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.method.value in WRITE_METHODS:
            self._outcomes[request.id] = self._translate_errors(self._write, request)
        try:
            return await kmock.RawHandler._handle(self, request)  # reactions, then fallbacks
        finally:
            self._outcomes.pop(request.id, None)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not isinstance(exc, kmock.KubernetesError):
            self.failures.append(exc)
            exc = api_error(500, "InternalError", repr(exc), traceback=traceback.format_exc())
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "code": exc.status,
            "reason": exc.reason,
            "message": exc.message,
            "details": exc.details or {},
        }
        return aiohttp.web.json_response(status, status=exc.status)

    @staticmethod
    def _translate_errors(fn: Callable[[kmock.Request], Any], request: kmock.Request) -> Any:
        try:
            return fn(request)
        except UnsupportedPatchType as exc:
            raise api_error(415, "UnsupportedMediaType", str(exc)) from exc
        except PatchError as exc:
            raise api_error(422, "Invalid", str(exc)) from exc
        except SelectorError as exc:
            raise bad_request(str(exc)) from exc

    def _route(self, request: kmock.Request) -> Route:
        resource = request.resource
        rtype = (
            self.catalog.get(resource.group, resource.version, resource.plural)
            if resource is not None
            else None
        )
        if rtype is None or (request.namespace and not rtype.namespaced):
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return Route(rtype, request.namespace, request.name, request.subresource)

    def _present(self, rtype: ResourceType, obj: Obj) -> Obj:
        return {**obj, "apiVersion": rtype.api_version}

    def _render(
        self, request: kmock.Request, rtype: ResourceType, objs: list[Obj], single: bool
    ) -> Obj:
        revision = str(self.store.revision)
        if wants_table(_header(request, "Accept")):
            include = request.params.get("includeObject", "Metadata")
            presented = [self._present(rtype, obj) for obj in objs]
            return table(
                rtype,
                presented,
                resource_version=revision,
                now=self.clock(),
                include_object=include,
            )
        if single:
            return self._present(rtype, objs[0])
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": revision},
            "items": [self._present(rtype, obj) for obj in objs],
        }

    # Discovery (overriding kmock's: it answers `groupVersion: "/v1"` and knows no CRDs).

    async def _serve_root(self, request: kmock.Request) -> rendering.Payload:
        paths = ["/api", "/api/v1", "/apis", "/version"]
        for group, versions in self.catalog.groups().items():
            paths += [f"/apis/{group}", *(f"/apis/{group}/{v}" for v in versions)] if group else []
        return {"paths": sorted(paths)}

    async def _serve_server_version(self, request: kmock.Request) -> rendering.Payload:
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0-emulator",
            "platform": "linux/amd64",
        }

    async def _serve_api(self, request: kmock.Request) -> rendering.Payload:
        return api_versions_doc()

    async def _serve_apis(self, request: kmock.Request) -> rendering.Payload:
        return group_list_doc(self.catalog)

    async def _serve_group(self, request: kmock.Request) -> rendering.Payload:
        doc = group_doc(self.catalog, request.url.path.strip("/").split("/")[-1])
        if doc is None:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return doc

    async def _serve_version(self, request: kmock.Request) -> rendering.Payload:
        path = parse_api_path(request.url.path)
        doc = resource_list_doc(self.catalog, path.group, path.version) if path else None
        if doc is None:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return doc

    # Reading.

    def _selector(self, request: kmock.Request, route: Route) -> Predicate:
        checks: list[Predicate] = []
        if route.namespace:
            checks.append(lambda obj: obj["metadata"].get("namespace") == route.namespace)
        if route.name:
            checks.append(lambda obj: obj["metadata"]["name"] == route.name)
        try:
            if request.params.get("labelSelector"):
                checks.append(label_selector(request.params["labelSelector"]))
            if request.params.get("fieldSelector"):
                checks.append(field_selector(request.params["fieldSelector"]))
        except SelectorError as exc:
            raise bad_request(str(exc)) from exc
        return lambda obj: all(check(obj) for check in checks)

    async def _serve_fetch(self, request: kmock.Request) -> rendering.Payload:
        route = self._route(request)
        if route.subresource not in (None, "status") or not route.name:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        obj = self.store.require(route.rtype, route.namespace, route.name)
        return self._render(request, route.rtype, [obj], single=True)

    async def _serve_list(self, request: kmock.Request) -> rendering.Payload:
        route = self._route(request)
        matches = self._selector(request, route)
        objs = [obj for obj in self.store.list(route.rtype, route.namespace) if matches(obj)]
        return self._render(request, route.rtype, objs, single=False)

    async def _serve_watch(self, request: kmock.Request) -> rendering.Payload:
        route = self._route(request)
        matches = self._selector(request, route)
        since = request.params.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise bad_request(f"invalid resourceVersion: {since!r}")
        stream = self._watch(request, route, matches, since)
        return rendering.Response(headers={"Content-Type": "application/json"}, payload=stream)

    async def _watch(
        self, request: kmock.Request, route: Route, matches: Predicate, since: str
    ) -> AsyncIterator[rendering.Payload]:
        yield b""  # start the response (kmock streams after the first chunk)
        timeout = request.params.get("timeoutSeconds")
        deadline = asyncio.get_running_loop().time() + float(timeout) if timeout else None
        if since in ("", "0"):
            cursor = len(self.store.changes)
            for obj in self.store.list(route.rtype, route.namespace):
                if matches(obj):
                    yield self._event(request, route, "ADDED", obj)
            if request.params.get("sendInitialEvents") == "true":
                yield self._initial_events_end()
        else:
            revisions = [change.revision for change in self.store.changes]
            cursor = bisect.bisect_right(revisions, int(since))
        while True:
            while cursor < len(self.store.changes):
                event = self._change_event(request, route, matches, self.store.changes[cursor])
                cursor += 1
                if event is not None:
                    yield event
            if not await self._wait_for_change(deadline):
                return

    async def _wait_for_change(self, deadline: float | None) -> bool:
        tick = self._tick
        if self._closing:
            return False
        left = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if left is not None and left <= 0:
            return False
        try:
            await asyncio.wait_for(tick.wait(), timeout=left)
        except TimeoutError:
            return False
        return not self._closing

    def _initial_events_end(self) -> Obj:
        marker = {
            "resourceVersion": str(self.store.revision),
            "annotations": {"k8s.io/initial-events-end": "true"},
        }
        return {"type": "BOOKMARK", "object": {"metadata": marker}}

    def _change_event(
        self, request: kmock.Request, route: Route, matches: Predicate, change: Change
    ) -> Obj | None:
        if (change.group, change.plural) != (route.rtype.group, route.rtype.plural):
            return None
        now_in = matches(change.obj)
        was_in = change.type == "MODIFIED" and change.old is not None and matches(change.old)
        kind = {(True, True): "MODIFIED", (True, False): "ADDED", (False, True): "DELETED"}
        if change.type != "MODIFIED":
            return self._event(request, route, change.type, change.obj) if now_in else None
        chosen = kind.get((now_in, was_in))
        return self._event(request, route, chosen, change.obj) if chosen else None

    def _event(self, request: kmock.Request, route: Route, kind: str, obj: Obj) -> Obj:
        return {"type": kind, "object": self._render(request, route.rtype, [obj], single=True)}

    # Writing: applied in _handle() (even if a user's reaction answers), answered here.

    async def _serve_outcome(self, request: kmock.Request) -> rendering.Payload:
        if request.id not in self._outcomes:  # a write to no API resource at all
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return self._outcomes.pop(request.id)

    _serve_create = _serve_update = _serve_delete = _serve_outcome

    def _write(self, request: kmock.Request) -> rendering.Response:
        route = self._route(request)
        if "protobuf" in _header(request, "Content-Type"):  # clients fall back to JSON on 415
            raise api_error(415, "UnsupportedMediaType", "protobuf is not supported: send JSON")
        verb = rbac_verb(request.method.value, parse_api_path(request.url.path), request.params)
        dry_run = request.params.get("dryRun") == "All"
        if verb == "create" and not (route.name or route.subresource):
            obj = self.store.create(route.rtype, route.namespace, request.data, dry_run=dry_run)
            return rendering.Response(status=201, payload=self._present(route.rtype, obj))
        if verb in ("update", "patch") and route.name:
            obj = self._modify(request, route, verb, dry_run)
        elif verb == "delete" and not route.subresource:
            obj = self._delete(request, route, dry_run)
        elif verb == "deletecollection":
            return rendering.Response(status=200, payload=self._delete_all(request, route))
        else:
            raise api_error(405, "MethodNotAllowed", f"{verb} is not supported here")
        return rendering.Response(status=200, payload=self._present(route.rtype, obj))

    def _modify(self, request: kmock.Request, route: Route, verb: str, dry_run: bool) -> Obj:
        assert route.name is not None
        content_type = _header(request, "Content-Type")
        body = request.data
        mutate = patcher(content_type, body) if verb == "patch" else (lambda _: body)
        exists = self.store.get(route.rtype, route.namespace, route.name) is not None
        if not exists and content_type.startswith(APPLY) and not route.subresource:
            return self.store.create(route.rtype, route.namespace, body, dry_run=dry_run)
        return self.store.update(
            route.rtype,
            route.namespace,
            route.name,
            mutate,
            subresource=route.subresource,
            dry_run=dry_run,
        )

    def _delete_options(self, request: kmock.Request) -> dict[str, Any]:
        body = request.data if isinstance(request.data, Mapping) else {}
        policy = body.get("propagationPolicy") or request.params.get("propagationPolicy")
        if body.get("orphanDependents") or request.params.get("orphanDependents") == "true":
            policy = policy or "Orphan"
        return {
            "propagation": policy or "Background",
            "preconditions": body.get("preconditions") or {},
            "dry_run": "All" in (body.get("dryRun") or []) or request.params.get("dryRun") == "All",
        }

    def _delete(self, request: kmock.Request, route: Route, dry_run: bool) -> Obj:
        assert route.name is not None
        options = self._delete_options(request)
        options["dry_run"] = options["dry_run"] or dry_run
        return self.store.delete(route.rtype, route.namespace, route.name, **options)

    def _delete_all(self, request: kmock.Request, route: Route) -> Obj:
        matches, options = self._selector(request, route), self._delete_options(request)
        doomed = [obj for obj in self.store.list(route.rtype, route.namespace) if matches(obj)]
        gone = [
            self.store.delete(
                route.rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"], **options
            )
            for obj in doomed
        ]
        return {
            "kind": f"{route.rtype.kind}List",
            "apiVersion": route.rtype.api_version,
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": [self._present(route.rtype, obj) for obj in gone],
        }
