"""The emulator's state machine: objects, resource versions, the change log, finalizers, GC.

All methods are synchronous and run on the server's event loop, so each write is atomic with
respect to concurrent requests and watch streams. Objects live in kmock's `ObjectsArray` (every
write appends a version to the object's history; a deletion appends `None`), keyed by the
resource at its storage version.
"""

from __future__ import annotations

import base64
import copy
import datetime
import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock
from emulator_catalog import Catalog, ResourceType, crd_types

Obj = dict[str, Any]
Key = tuple[kmock.resource, str | None, str]
Mutation = Callable[[Obj], Any]

SERVER_FIELDS = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details)


def not_found(rtype: ResourceType, name: str) -> kmock.KubernetesError:
    what = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
    return api_error(
        404,
        "NotFound",
        f'{what} "{name}" not found',
        name=name,
        group=rtype.group,
        kind=rtype.plural,
    )


def invalid(rtype: ResourceType, name: str, message: str) -> kmock.KubernetesError:
    return api_error(422, "Invalid", message, name=name, group=rtype.group, kind=rtype.kind)


def bad_request(message: str) -> kmock.KubernetesError:
    return api_error(400, "BadRequest", message)


def conflict(rtype: ResourceType, name: str, message: str) -> kmock.KubernetesError:
    return api_error(409, "Conflict", message, name=name, group=rtype.group, kind=rtype.plural)


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    """One write, as watch streams replay it: the object after it and (if any) before it."""

    revision: int
    group: str
    plural: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    old: Obj | None


def _spec_part(rtype: ResourceType, obj: Mapping[str, Any]) -> Obj:
    """What `metadata.generation` tracks: all but metadata (and status, if a subresource)."""
    skipped = {"metadata", "status"} if rtype.has_status else {"metadata"}
    return {key: value for key, value in obj.items() if key not in skipped}


@dataclass
class Store:
    objects: kmock.ObjectsArray
    catalog: Catalog
    clock: Callable[[], datetime.datetime]
    revision: int = 1
    changes: list[Change] = field(default_factory=list)
    listeners: list[Callable[[], None]] = field(default_factory=list)
    names: random.Random = field(default_factory=lambda: random.Random(0))

    # Reading.

    def key(self, rtype: ResourceType, namespace: str | None, name: str) -> Key:
        resource = kmock.resource(rtype.group, rtype.stored_as, rtype.plural)
        return resource, namespace if rtype.namespaced else None, name

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj | None:
        key = self.key(rtype, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].last.raw)

    def require(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.get(rtype, namespace, name)
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def list(self, rtype: ResourceType, namespace: str | None = None) -> list[Obj]:
        found = [
            (key, obj)
            for key, obj in self._stored()
            if (key[0].group, key[0].plural) == (rtype.group, rtype.plural)
            and (namespace is None or key[1] == namespace)
        ]
        found.sort(key=lambda item: (item[0][1] or "", item[0][2]))
        return [copy.deepcopy(obj) for _, obj in found]

    def _stored(self) -> Iterator[tuple[Key, Obj]]:
        for key, obj in list(self.objects.items()):
            if not obj.deleted:
                yield key, obj.last.raw

    # Writing.

    def create(
        self, rtype: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False
    ) -> Obj:
        obj = self._new_object(rtype, namespace, body)
        name = obj["metadata"]["name"]
        if self.get(rtype, obj["metadata"].get("namespace"), name) is not None:
            what = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
            raise api_error(
                409,
                "AlreadyExists",
                f'{what} "{name}" already exists',
                name=name,
                group=rtype.group,
                kind=rtype.plural,
            )
        self._server_side(rtype, obj, created=True)
        if not dry_run:
            self._commit(rtype, "ADDED", obj, None)
        return obj

    def update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        mutate: Mutation,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        current = self.require(rtype, namespace, name)
        candidate = mutate(copy.deepcopy(current))
        if not isinstance(candidate, dict) or not isinstance(candidate.get("metadata", {}), dict):
            raise invalid(rtype, name, "the updated object must be a JSON object with metadata")
        new = self._updated(rtype, current, candidate, subresource)
        if new == current:
            return current  # a no-op write: no new resourceVersion, no watch event
        if _spec_part(rtype, new) != _spec_part(rtype, current):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self._server_side(rtype, new, created=False)
        if dry_run:
            return new
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rtype, new, current)
        self._commit(rtype, "MODIFIED", new, current)
        return new

    def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        current = self.require(rtype, namespace, name)
        self._check_preconditions(rtype, current, preconditions or {})
        if dry_run:
            return current
        uid = current["metadata"]["uid"]
        if propagation == "Orphan":
            self._orphan(uid)
        elif propagation == "Foreground":
            self._cascade(uid)
        if current["metadata"].get("deletionTimestamp"):
            return current
        if current["metadata"].get("finalizers"):
            return self._mark_deleting(rtype, current)
        return self._remove(rtype, copy.deepcopy(current), current)

    # Internals of writing.

    def _new_object(self, rtype: ResourceType, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, Mapping) or not isinstance(body.get("metadata", {}), Mapping):
            raise bad_request("the request body must be a JSON object with metadata")
        if body.get("kind", rtype.kind) != rtype.kind:
            raise bad_request(f"the body's kind {body.get('kind')!r} is not {rtype.kind!r}")
        obj: Obj = copy.deepcopy(dict(body))
        obj.update(
            apiVersion=f"{rtype.group}/{rtype.stored_as}" if rtype.group else "v1", kind=rtype.kind
        )
        meta = obj.setdefault("metadata", {})
        self._place(rtype, meta, namespace)
        for server_field in SERVER_FIELDS[2:]:
            meta.pop(server_field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339(self.clock()), generation=1)
        if rtype.has_status:
            obj.pop("status", None)
        return obj

    def _place(self, rtype: ResourceType, meta: Obj, namespace: str | None) -> None:
        if rtype.namespaced:
            if namespace and meta.get("namespace", namespace) != namespace:
                raise bad_request("the namespace of the object does not match the request's")
            meta["namespace"] = namespace or meta.get("namespace")
            if not meta["namespace"]:
                raise bad_request(f"{rtype.kind} is namespaced: a namespace is required")
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(rtype, "", "metadata.name or metadata.generateName is required")
            meta["name"] = prefix + "".join(self.names.choices(NAME_ALPHABET, k=5))

    def _updated(
        self, rtype: ResourceType, current: Obj, candidate: Obj, subresource: str | None
    ) -> Obj:
        name = current["metadata"]["name"]
        if subresource not in (None, "status") or (subresource and not rtype.has_status):
            raise not_found(rtype, f"{name}/{subresource}")
        given = candidate.get("metadata", {}).get("resourceVersion")
        if given is not None and given != current["metadata"]["resourceVersion"]:
            raise conflict(
                rtype,
                name,
                f"Operation cannot be fulfilled on {rtype.plural} "
                f'"{name}": the object has been modified; please apply your changes '
                "to the latest version and try again",
            )
        # With a status subresource, /status writes change only .status, others all but .status.
        status_source = candidate if subresource or not rtype.has_status else current
        status = copy.deepcopy(status_source.get("status"))
        new = copy.deepcopy(current) if subresource else candidate
        new.pop("status", None)
        if status is not None:
            new["status"] = status
        new.update(apiVersion=current["apiVersion"], kind=current["kind"])
        meta = new.setdefault("metadata", {})
        for server_field in SERVER_FIELDS:
            meta.pop(server_field, None)
            if server_field in current["metadata"]:
                meta[server_field] = current["metadata"][server_field]
        return new

    def _check_preconditions(
        self, rtype: ResourceType, current: Obj, preconditions: Mapping[str, Any]
    ) -> None:
        for precondition in ("uid", "resourceVersion"):
            expected = preconditions.get(precondition)
            if expected is not None and expected != current["metadata"].get(precondition):
                raise conflict(
                    rtype,
                    current["metadata"]["name"],
                    f"Precondition failed: {precondition} is not {expected}",
                )

    def _server_side(self, rtype: ResourceType, obj: Obj, *, created: bool) -> None:
        """Fields an API server or its built-in controllers fill in."""
        if rtype.is_crd:
            self._crd_status(obj)
        elif created and rtype.kind in ("Pod", "Namespace") and not rtype.group:
            obj["status"] = {"phase": "Pending" if rtype.kind == "Pod" else "Active"}
        elif rtype.kind == "Secret" and not rtype.group and "stringData" in obj:
            # stringData is write-only: the server stores it base64-encoded in data.
            data = obj.setdefault("data", {})
            for key, text in obj.pop("stringData").items():
                data[key] = base64.b64encode(text.encode()).decode()

    def _crd_status(self, crd: Obj) -> None:
        """Validate a CRD and report it established (there is no schema validation)."""
        name = crd["metadata"]["name"]
        try:
            types = crd_types(crd)
        except ValueError as exc:
            raise invalid(self.catalog.lookup("crd"), name, str(exc)) from exc
        expected = f"{types[0].plural}.{types[0].group}" if types else None
        if name != expected:
            raise invalid(
                self.catalog.lookup("crd"),
                name,
                "metadata.name must be <spec.names.plural>.<spec.group>, "
                "with at least one served version",
            )
        since = crd["metadata"]["creationTimestamp"]
        crd["status"] = {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "storedVersions": [types[0].stored_as],
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "lastTransitionTime": since,
                    "message": "",
                }
                for kind, reason in (
                    ("NamesAccepted", "NoConflicts"),
                    ("Established", "InitialNamesAccepted"),
                )
            ],
        }

    def _serve_crd(self, crd: Obj) -> None:
        self.catalog.remove(crd["spec"]["group"], crd["spec"]["names"]["plural"])
        self.catalog.add(crd_types(crd))

    def _mark_deleting(self, rtype: ResourceType, current: Obj) -> Obj:
        new = copy.deepcopy(current)
        new["metadata"].update(
            deletionTimestamp=rfc3339(self.clock()), deletionGracePeriodSeconds=0
        )
        self._commit(rtype, "MODIFIED", new, current)
        return new

    def _remove(self, rtype: ResourceType, final: Obj, current: Obj) -> Obj:
        self._commit(rtype, "DELETED", final, current)
        self._cascade(final["metadata"]["uid"])
        if rtype.is_crd:
            self._drop_crd(final)
        elif (rtype.group, rtype.plural) == ("", "namespaces"):
            self._drop_namespace(final["metadata"]["name"])
        return final

    def _drop_crd(self, crd: Obj) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        types = [t for t in self.catalog.types.values() if (t.group, t.plural) == (group, plural)]
        for rtype in types[:1]:
            for obj in self.list(rtype):
                self._remove(rtype, obj, copy.deepcopy(obj))
        self.catalog.remove(group, plural)

    def _drop_namespace(self, namespace: str) -> None:
        for key, _ in list(self._stored()):
            rtype = self.catalog.get(key[0].group, key[0].version, key[0].plural)
            if key[1] == namespace and rtype is not None:
                self.delete(rtype, namespace, key[2])

    def _dependents(self, uid: str) -> list[tuple[ResourceType, Obj]]:
        found = []
        for key, obj in self._stored():
            refs = obj.get("metadata", {}).get("ownerReferences") or []
            rtype = self.catalog.get(key[0].group, key[0].version, key[0].plural)
            if rtype is not None and any(ref.get("uid") == uid for ref in refs):
                found.append((rtype, copy.deepcopy(obj)))
        return found

    def _cascade(self, uid: str) -> None:
        """Owner-reference garbage collection: delete what the gone (or going) owner owned."""
        for rtype, obj in self._dependents(uid):
            meta = obj["metadata"]
            if self.get(rtype, meta.get("namespace"), meta["name"]) is not None:
                self.delete(rtype, meta.get("namespace"), meta["name"])

    def _orphan(self, uid: str) -> None:
        def drop_ref(obj: Obj) -> Obj:
            refs = obj["metadata"].get("ownerReferences", [])
            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
            return obj

        for rtype, obj in self._dependents(uid):
            self.update(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"], drop_ref)

    def _commit(self, rtype: ResourceType, kind: str, obj: Obj, old: Obj | None) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        key = self.key(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key not in self.objects:
            self.objects[key] = copy.deepcopy(obj)
        else:
            self.objects[key].history.append(copy.deepcopy(obj))
        if kind == "DELETED":
            self.objects[key].delete()
        elif rtype.is_crd:
            self._serve_crd(obj)
        self.changes.append(
            Change(
                self.revision,
                rtype.group,
                rtype.plural,
                kind,
                copy.deepcopy(obj),
                copy.deepcopy(old),
            )
        )
        for listener in self.listeners:
            listener()
