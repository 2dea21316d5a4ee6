"""The Kubernetes API as plain dicts: the few verbs the operator, the status sink and the fit Job
use, on top of the `kubernetes` package's configuration (in-cluster credentials, else KUBECONFIG or
~/.kube/config) and its authenticated HTTP pool.

Plain dicts rather than the generated model classes: our builders produce dicts, and a manifest
should reach the server exactly as built. Label selectors are sent and also applied here, because
test API servers may ignore them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from scalerl.errors import ScaleRLError

log = logging.getLogger(__name__)
T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# kind -> plural, for every kind we touch (no discovery round trip needed).
PLURALS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "NetworkPolicy": "networkpolicies",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Pod": "pods",
    "Event": "events",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Job": "jobs",
    "Deployment": "deployments",
    "JobSet": "jobsets",
    "Workload": "workloads",
    "ScaleRLRun": "scalerlruns",
    "ScaleRLSweep": "scalerlsweeps",
}
RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
VERSION = "0.1.0"


class KubeError(ScaleRLError):
    """The API server refused a request, or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, *, causes: bool = False) -> None:
        self.status = status
        self.causes = causes  # the server named fields it found invalid
        super().__init__(message)

    @property
    def transient(self) -> bool:
        return self.status == 0 or self.status in RETRIED_STATUS

    @property
    def conflict(self) -> bool:
        """Somebody wrote first: a 409 (resourceVersion), or a 422 for a failed JSON-patch `test`
        (our precondition), which names no field. A 422 that names fields is an invalid object:
        trying again sends the same object again, so it is no conflict."""
        return self.status == 409 or (self.status == 422 and not self.causes)


def api_path(
    api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None
) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def matches(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class Kube:
    """Synchronous, thread-safe (one urllib3 pool): kopf runs our sync handlers in threads."""

    def __init__(self, client: Any, timeout_s: float = 15.0) -> None:
        self.client = client  # kubernetes.client.ApiClient
        self.timeout_s = timeout_s

    @classmethod
    def connect(cls, server: str | None = None, *, agent: str = "scalerl") -> Kube:
        """As kubectl connects: in-cluster credentials in a pod, else KUBECONFIG/~/.kube/config;
        `server` (an insecure URL, for tests) overrides both. `agent` names the caller in the
        User-Agent (the operator, a run's trainer, a fit) for audit logs."""
        from kubernetes import client, config

        configuration = client.Configuration()
        if server is not None:
            configuration.host = server
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                try:
                    # KUBECONFIG read now, not when `kubernetes` was imported.
                    config.load_kube_config(
                        config_file=os.environ.get("KUBECONFIG"),
                        client_configuration=configuration,
                    )
                except (config.ConfigException, OSError) as err:
                    raise KubeError(0, f"no cluster credentials: {err}") from None
        api = client.ApiClient(configuration)
        api.user_agent = f"{agent}/{VERSION}"
        return cls(api)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        _, url, headers, _, _ = self.client.param_serialize(
            method, path, header_params=headers, auth_settings=["BearerToken"]
        )
        try:
            response = self.client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self.timeout_s
            )
            text = response.read()
        except Exception as err:  # urllib3's connection errors have no common base with ours
            raise KubeError(0, f"{method} {path}: {err}") from None
        if not 200 <= response.status < 300:
            raise KubeError(
                response.status, f"{method} {path}: {_message(text)}", causes=_has_causes(text)
            )
        return json.loads(text) if text else None

    def get(self, api_version: str, kind: str, ns: str, name: str, sub: str | None = None) -> Any:
        return self.request("GET", api_path(api_version, kind, ns, name, sub))

    def find(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        try:
            return dict(self.get(api_version, kind, ns, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        ns: str,
        labels: dict[str, str],
        fields: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """The objects with `labels` (and `fields`, a field selector the server applies)."""
        query = {"labelSelector": selector(labels)}
        if fields:
            query["fieldSelector"] = selector(fields)
        items = self.request("GET", f"{api_path(api_version, kind, ns)}?{urlencode(query)}")
        return [i for i in items["items"] if matches(i, labels)]

    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create `obj`; None when an object of that name already exists."""
        meta = obj["metadata"]
        path = api_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            return dict(self.request("POST", path, obj))
        except KubeError as err:
            if err.status == 409:
                return None
            raise

    def patch(
        self,
        api_version: str,
        kind: str,
        ns: str,
        name: str,
        body: Any,
        *,
        sub: str | None = None,
        json_patch: bool = False,
    ) -> Any:
        content_type = JSON_PATCH if json_patch else MERGE_PATCH
        path = api_path(api_version, kind, ns, name, sub)
        return self.request("PATCH", path, body, content_type)

    def delete(self, api_version: str, kind: str, ns: str, name: str) -> bool:
        """Delete (dependents in the background); False when it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self.request("DELETE", api_path(api_version, kind, ns, name), body)
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True


def retrying(
    call: Callable[[], T], *, attempts: int = 5, delay_s: float = 0.2, conflicts: bool = False
) -> T:
    """`call()`, again after transient errors (and conflicts, if asked), with growing delays."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except KubeError as err:
            again = err.transient or (conflicts and err.conflict)
            if not again or attempt == attempts:
                raise
            log.debug("retrying after %s (attempt %d/%d)", err, attempt, attempts)
            time.sleep(delay_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _has_causes(text: bytes | str | None) -> bool:
    """Whether a Status body lists causes (the fields of an invalid object)."""
    try:
        status = json.loads(text or "null")
    except ValueError:
        return False
    details = status.get("details") if isinstance(status, dict) else None
    return bool(isinstance(details, dict) and details.get("causes"))


def _message(text: bytes | str | None) -> str:
    if not text:
        return "no response body"
    try:
        status = json.loads(text)
    except ValueError:
        return str(text)[:300]
    return str(status.get("message") or status) if isinstance(status, dict) else str(status)
