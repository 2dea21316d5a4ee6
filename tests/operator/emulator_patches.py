"""Patch formats of the Kubernetes API, applied to plain JSON objects.

- `application/merge-patch+json` (RFC 7386): dicts merge recursively, `null` deletes, lists are
  replaced. kopf uses it for everything but finalizers.
- `application/json-patch+json` (RFC 6902): kopf removes finalizers with it, guarded by a `test`
  of `/metadata/resourceVersion`; a failed test is a 422, so kopf retries on the next event.
- `application/strategic-merge-patch+json` (kubectl apply/patch of built-in kinds): as a merge
  patch, except that lists of dicts with a known merge key (containers by `name`, …) merge item
  by item and `$`-directives are dropped. An approximation: `$patch: delete/replace` and
  `$retainKeys` are not honoured.
- `application/apply-patch+yaml` (server-side apply): applied as a merge patch (one manager only;
  fields dropped from the applied configuration are not removed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch

JSON = "application/json-patch+json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# List fields of built-in kinds that strategic merge patches merge by a key, not replace.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "volumeClaimTemplates": "name",
    "tolerations": "key",
}


class PatchError(ValueError):
    """The patch is malformed or cannot apply (e.g. a failed JSON-patch `test`)."""


class UnsupportedPatchType(PatchError):
    """The request's Content-Type is no patch format the emulator knows."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_list(target: Any, patch: list[Any], key: str) -> list[Any]:
    if not isinstance(target, list) or not all(isinstance(i, Mapping) and key in i for i in patch):
        return [strip_directives(item) for item in patch]
    result = list(target)
    positions = {
        item.get(key): index for index, item in enumerate(result) if isinstance(item, Mapping)
    }
    for item in patch:
        if item[key] in positions:
            index = positions[item[key]]
            result[index] = strategic_merge_patch(result[index], item)
        else:
            result.append(strip_directives(item))
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return strip_directives(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key), value, MERGE_KEYS[key])
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def strip_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [strip_directives(item) for item in value]
    return copy.deepcopy(value)


def json_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(copy.deepcopy(target), patch)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(f"the JSON patch test failed: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as exc:
        raise PatchError(f"the JSON patch cannot apply: {exc}") from exc


def patcher(content_type: str, patch: Any) -> Callable[[dict[str, Any]], Any]:
    """A function from the current object to the patched one, per the request's Content-Type."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON:
        return lambda obj: json_patch(obj, patch)
    if kind not in (STRATEGIC, MERGE, APPLY):
        raise UnsupportedPatchType(f"unsupported patch content type: {content_type!r}")
    if not isinstance(patch, Mapping):
        raise PatchError(f"a {kind or 'patch'} body must be a JSON object")
    if kind == STRATEGIC:
        return lambda obj: strategic_merge_patch(obj, patch)
    return lambda obj: merge_patch(obj, patch)
