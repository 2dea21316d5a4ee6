"""Requests to the emulated API: URL parsing, RBAC verbs and the request log's records.

kmock parses `/api/v1/namespaces` wrongly (it takes `namespaces` for a namespace marker and
fails), so the emulator parses every request itself into kmock's `Request`, keeping kmock's
fields (action, resource, namespace, name, subresource) so that its DSL filters still apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock._internal import rendering  # Request has no public constructor


@dataclass(frozen=True)
class ApiPath:
    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_api_path(path: str) -> ApiPath | None:
    """`/api/v1/…` and `/apis/<group>/<version>/…` split into their parts; None for other URLs."""
    parts = [part for part in path.split("/") if part]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    namespace_itself = len(rest) == 3 and rest[2] in ("status", "finalize")
    if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_itself:
        namespace, rest = rest[1], rest[2:]
    return ApiPath(
        group,
        version,
        rest[0] if rest else None,
        namespace,
        rest[1] if len(rest) > 1 else None,
        "/".join(rest[2:]) or None,
    )


def rbac_verb(method: str, path: ApiPath | None, params: Mapping[str, str]) -> str:
    """The verb an RBAC rule must grant for this request (lowercased method for other URLs)."""
    if path is None or path.plural is None:
        return method.lower()
    if method == "GET":
        return "watch" if params.get("watch") in ("true", "1") else "get" if path.name else "list"
    if method == "DELETE":
        return "delete" if path.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


@dataclass
class ApiCall:
    """One request, as an RBAC rule sees it, and its response's status (once answered)."""

    method: str
    path: str
    query: Mapping[str, str]
    verb: str
    group: str | None = None
    version: str | None = None
    resource: str | None = None  # the plural, or None for non-resource URLs
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    status: int | None = None
    user_agent: str = ""  # who called: kopf/…, scalerl-operator/…, scalerl/…, kubectl/…

    @property
    def rbac_resource(self) -> str | None:
        if self.resource is None or not self.subresource:
            return self.resource
        return f"{self.resource}/{self.subresource}"

    @property
    def is_write(self) -> bool:
        return self.verb in ("create", "update", "patch", "delete", "deletecollection")


def _kmock_action(verb: str) -> kmock.action | None:
    actions = {
        "list": kmock.action.LIST,
        "watch": kmock.action.WATCH,
        "get": kmock.action.FETCH,
        "create": kmock.action.CREATE,
        "patch": kmock.action.UPDATE,
        "delete": kmock.action.DELETE,
    }
    return actions.get(verb)


def _decode(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        try:
            return yaml.safe_load(body)  # server-side apply may send YAML
        except yaml.YAMLError:
            return None


async def parse_request(raw: aiohttp.web.BaseRequest, *, id: int) -> kmock.Request:
    """Like kmock's own parsing, but namespaces (`/api/v1/namespaces[/x]`) parse correctly."""
    body = await raw.read()
    params = dict(raw.query)
    path = parse_api_path(raw.path)
    is_resource = path is not None and path.plural is not None
    return rendering.Request(
        id=id,
        raw_request=raw,
        url=raw.url,
        method=raw.method,
        params=params,
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        body=body,
        text=body.decode("utf-8", "replace"),
        data=_decode(body),
        action=_kmock_action(rbac_verb(raw.method, path, params)) if is_resource else None,
        resource=kmock.resource(path.group, path.version, path.plural) if path else None,
        namespace=path.namespace if path else None,
        name=path.name if path else None,
        subresource=path.subresource if path else None,
    )


def api_call(request: kmock.Request) -> ApiCall:
    path = parse_api_path(request.url.path)
    method = str(request.method.value)
    return ApiCall(
        method=method,
        path=request.url.path,
        query=dict(request.params),
        verb=rbac_verb(method, path, request.params),
        group=path.group if path else None,
        version=path.version if path else None,
        resource=path.plural if path else None,
        subresource=path.subresource if path else None,
        namespace=path.namespace if path else None,
        name=path.name if path else None,
        user_agent=next((v for k, v in request.headers.items() if k.lower() == "user-agent"), ""),
    )
