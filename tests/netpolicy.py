"""NetworkPolicies judged as a network plugin applies them: may this pod open a connection to
that pod, or to that address outside the cluster, on that port? (Kubernetes' rules: a pod no
Egress policy selects may open anything; one that some select may open only what one of their
rules allows; policies add up.) The tests of the operator's per-run policies and of the chart's
policy ask their questions through `reaches`."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    labels: dict[str, str]
    namespace: str
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression  # the only one the operator writes
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _peer_matches(peer: dict[str, Any], own: Pod, other: Pod | str) -> bool:
    """Whether a rule's peer names `other`, in a policy over `own` (a peer without a
    namespaceSelector means the policy's own namespace)."""
    if "ipBlock" in peer:
        if not isinstance(other, str):
            return False  # an ipBlock is for addresses outside the cluster
        address = ipaddress.ip_address(other)
        cidr = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        return address.version == cidr.version and address in cidr
    if isinstance(other, str):
        return False
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], other.ns_labels())
    else:
        in_namespace = other.namespace == own.namespace
    return in_namespace and selects(peer.get("podSelector", {}), other.labels)


def _allowed(
    policies: list[dict[str, Any]],
    direction: str,
    own: Pod,
    other: Pod | str,
    port: int,
    protocol: str,
) -> bool:
    peers_key = "to" if direction == "Egress" else "from"
    mine = [
        p["spec"]
        for p in policies
        if p["metadata"]["namespace"] == own.namespace
        and direction in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], own.labels)
    ]
    if not mine:
        return True  # no policy of this direction selects the pod: everything is open
    for spec in mine:
        for rule in spec.get(direction.lower(), []):
            ports = rule.get("ports") or []
            if ports and not any(p["port"] == port and p["protocol"] == protocol for p in ports):
                continue
            peers = rule.get(peers_key) or []
            if not peers or any(_peer_matches(peer, own, other) for peer in peers):
                return True
    return False


def reaches(
    policies: list[dict[str, Any]], source: Pod, dest: Pod | str, port: int, protocol: str = "TCP"
) -> bool:
    """Whether `source` may open a connection to `dest` (a pod, or an address outside the
    cluster) on `port`, by its Egress policies."""
    return _allowed(policies, "Egress", source, dest, port, protocol)


def admits(
    policies: list[dict[str, Any]], dest: Pod, source: Pod | str, port: int, protocol: str = "TCP"
) -> bool:
    """Whether `dest` accepts a connection from `source` on `port`, by its Ingress policies
    (the kubelet's probes from the pod's own node are always allowed: not asked here)."""
    return _allowed(policies, "Ingress", dest, source, port, protocol)
