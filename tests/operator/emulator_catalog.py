"""The resource types the API emulator serves: built-in kinds, CRD-defined kinds, discovery.

A `ResourceType` is one served group/version/plural. Built-ins are listed here; custom resources
are derived from CustomResourceDefinition objects (one type per served version, all stored under
the CRD's storage version). The discovery documents (`/api`, `/apis`, `/apis/<g>/<v>`) are built
from the catalog so that kubectl (RESTMapper, short names) and kopf (scanning, subresources) see
the same set of resources as the emulator actually serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
CRD_GROUP = "apiextensions.k8s.io"
CRD_PLURAL = "customresourcedefinitions"


@dataclass(frozen=True)
class Column:
    """One printer column: `name` shown uppercased by kubectl, its value found by `json_path`."""

    name: str
    type: str  # integer | number | string | boolean | date
    json_path: str
    priority: int = 0
    description: str = ""
    format: str = ""


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()
    singular: str = ""
    storage_version: str = ""  # where the objects live; "" means this very version
    custom: bool = False  # served from a CustomResourceDefinition

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def stored_as(self) -> str:
        return self.storage_version or self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def is_crd(self) -> bool:
        return (self.group, self.plural) == (CRD_GROUP, CRD_PLURAL)

    def discovery_entries(self) -> list[dict[str, Any]]:
        main = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(ALL_VERBS),
            "shortNames": list(self.short_names),
            "categories": list(self.categories),
        }
        subs = [
            {
                "name": f"{self.plural}/{sub}",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": list(SUBRESOURCE_VERBS),
            }
            for sub in self.subresources
        ]
        return [main, *subs]


def _core(
    plural: str,
    kind: str,
    *short: str,
    status: bool = False,
    namespaced: bool = True,
    columns: tuple[Column, ...] = (),
    group: str = "",
    version: str = "v1",
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        subresources=("status",) if status else (),
        columns=columns,
    )


_PHASE = (Column("Status", "string", ".status.phase"),)
_ALL = ("all",)

BUILTINS: tuple[ResourceType, ...] = (
    _core("pods", "Pod", "po", status=True, columns=_PHASE, categories=_ALL),
    _core("services", "Service", "svc", status=True, categories=_ALL),
    _core("configmaps", "ConfigMap", "cm"),
    _core("secrets", "Secret"),
    _core("serviceaccounts", "ServiceAccount", "sa"),
    _core("events", "Event", "ev"),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", "pvc", status=True),
    _core("namespaces", "Namespace", "ns", status=True, namespaced=False, columns=_PHASE),
    _core("statefulsets", "StatefulSet", "sts", status=True, group="apps", categories=_ALL),
    _core("deployments", "Deployment", "deploy", status=True, group="apps", categories=_ALL),
    _core("jobs", "Job", status=True, group="batch", categories=_ALL),
    _core("roles", "Role", group="rbac.authorization.k8s.io"),
    _core("rolebindings", "RoleBinding", group="rbac.authorization.k8s.io"),
    _core("clusterroles", "ClusterRole", group="rbac.authorization.k8s.io", namespaced=False),
    _core(
        "clusterrolebindings",
        "ClusterRoleBinding",
        group="rbac.authorization.k8s.io",
        namespaced=False,
    ),
    _core("networkpolicies", "NetworkPolicy", "netpol", group="networking.k8s.io"),
    _core("poddisruptionbudgets", "PodDisruptionBudget", "pdb", status=True, group="policy"),
    _core("events", "Event", "ev", group="events.k8s.io"),
    _core("leases", "Lease", group="coordination.k8s.io"),
    _core(
        CRD_PLURAL,
        "CustomResourceDefinition",
        "crd",
        "crds",
        status=True,
        group=CRD_GROUP,
        namespaced=False,
    ),
)


def crd_types(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The served versions of a CRD as resource types; ValueError if the CRD is malformed."""
    try:
        spec = crd["spec"]
        names, versions = spec["names"], spec["versions"]
        stored = [v["name"] for v in versions if v.get("storage")] or [versions[0]["name"]]
        return [
            _crd_version(spec, names, version, stored[0])
            for version in versions
            if version.get("served", True)
        ]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"malformed CustomResourceDefinition: missing {exc}") from exc


def _crd_version(
    spec: Mapping[str, Any],
    names: Mapping[str, Any],
    version: Mapping[str, Any],
    storage_version: str,
) -> ResourceType:
    columns = tuple(
        Column(
            name=c["name"],
            type=c.get("type", "string"),
            json_path=c["jsonPath"],
            priority=c.get("priority", 0),
            description=c.get("description", ""),
            format=c.get("format", ""),
        )
        for c in version.get("additionalPrinterColumns", ())
    )
    return ResourceType(
        group=spec["group"],
        version=version["name"],
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames", ())),
        categories=tuple(names.get("categories", ())),
        subresources=tuple(sorted(version.get("subresources", {}))),
        columns=columns,
        singular=names.get("singular", ""),
        storage_version=storage_version,
        custom=True,
    )


@dataclass
class Catalog:
    """All served resource types, keyed by (group, version, plural)."""

    types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)

    @classmethod
    def with_builtins(cls) -> Catalog:
        catalog = cls()
        catalog.add(BUILTINS)
        return catalog

    def add(self, types: Iterable[ResourceType]) -> None:
        for rtype in types:
            self.types[rtype.group, rtype.version, rtype.plural] = rtype

    def remove(self, group: str, plural: str) -> None:
        for key in [key for key in self.types if (key[0], key[2]) == (group, plural)]:
            del self.types[key]

    def get(
        self, group: str | None, version: str | None, plural: str | None
    ) -> ResourceType | None:
        return self.types.get((group or "", version or "", plural or ""))

    def lookup(self, name: str) -> ResourceType:
        """Find a type by plural, singular, kind or short name, optionally `name.group`."""
        base, _, group = name.partition(".")
        for rtype in self.types.values():
            names = {rtype.plural, rtype.kind.lower(), rtype.singular, *rtype.short_names}
            if base.lower() in names and group in ("", rtype.group) and self._preferred(rtype):
                return rtype
        raise KeyError(f"no such resource type: {name}")

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rtype in self.types.values():
            if (rtype.group, rtype.version, rtype.kind) == (group, version, kind):
                return rtype
        raise KeyError(f"no such kind: {kind} in {api_version}")

    def _preferred(self, rtype: ResourceType) -> bool:
        return rtype.version == rtype.stored_as

    def groups(self) -> dict[str, list[str]]:
        """Group name → served versions, the storage (preferred) version first."""
        result: dict[str, list[str]] = {}
        for rtype in sorted(self.types.values(), key=lambda t: not self._preferred(t)):
            versions = result.setdefault(rtype.group, [])
            if rtype.version not in versions:
                versions.append(rtype.version)
        return result

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self.types.values() if (t.group, t.version) == (group, version)]


def api_versions_doc() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def _group_doc(name: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def group_list_doc(catalog: Catalog) -> dict[str, Any]:
    groups = [
        _group_doc(name, versions) for name, versions in sorted(catalog.groups().items()) if name
    ]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group_doc(catalog: Catalog, group: str) -> dict[str, Any] | None:
    versions = catalog.groups().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}


def resource_list_doc(catalog: Catalog, group: str, version: str) -> dict[str, Any] | None:
    types = catalog.in_group_version(group, version)
    if not types:
        return None
    entries = [
        entry
        for rtype in sorted(types, key=lambda t: t.plural)
        for entry in rtype.discovery_entries()
    ]
    group_version = version if not group else f"{group}/{version}"
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }
