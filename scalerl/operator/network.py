"""A run's NetworkPolicies: what reaches its pods, and what its pods reach.

NetworkPolicies add up (a connection is allowed when any policy that selects the pod allows it),
so a run has:

- `<run>-network`, over every pod of the run: in, only the run's own pods (and /metrics from the
  monitoring namespaces); out, only the run's own pods (rollout stream, sync store, the ranks'
  gloo and NCCL ports, the OpenEnv server) and DNS. Nothing else: an OpenEnv server's pod and a
  generator of a run that installs nothing reach no more than that.
- `<run>-egress-<role>`, one per role that needs more (`egress_needs`): the API server for the
  pods that run as the run's ServiceAccount (trainer 0 writes status, the fit and initializer
  Jobs too); outside hosts on the ports the spec implies, and only when it implies them.

Kubernetes cannot name a host in a NetworkPolicy, so an outside host is any address (0.0.0.0/0,
::/0, and any pod of the cluster, for a tracker served inside it) on the port its URL names (its
scheme's, 443 or 80, where it names none): MLflow at spec.tracking.mlflow.uri (80, 443 and
MLflow's 5000 where the URI comes from the tracker Secret), W&B online and trackio with a Secret
(a Space) on 443 (trainer and fit Job, which log); the Hub on spec.hub.endpoint's port or 443
(the initializer Job alone: the gang reads the claim's copy, offline); the package index of
spec.environment.packages on spec.environment.indexUrl's port, or 443 (80 too for an index in a
Secret), and spec.environment.openenv.url's port (the pods that run rollouts: generators, or a
colocated run's one pod). Code rewards run in bubblewrap sandboxes inside the generator pods,
with no network of their own (scalerl.sandbox): the generator's policy is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scalerl.operator import names, sources
from scalerl.operator.envserver import runs_rollouts
from scalerl.operator.objects import METRICS_PORT, Owner
from scalerl.spec import ScaleRLRun

API = "networking.k8s.io/v1"
# Any address: Kubernetes cannot name a host, only CIDRs and the cluster's pods.
ANYWHERE = ({"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}})
# MLflow's own default port, for a tracking URI the operator cannot see (in the tracker Secret).
MLFLOW_PORT = 5000
DNS_PORT = 53
# The roles whose pods run as the run's ServiceAccount and call the API server.
API_ROLES = (names.ROLE_TRAINER, names.ROLE_FIT, names.ROLE_INITIALIZER)
# The roles that may get an egress policy of their own, in creation order.
EGRESS_ROLES = (names.ROLE_TRAINER, names.ROLE_GENERATOR, names.ROLE_FIT, names.ROLE_INITIALIZER)


@dataclass(frozen=True)
class NetworkSettings:
    """The runs' NetworkPolicies (the chart's `networkPolicy` values)."""

    enabled: bool = True
    # Namespaces (by name) whose pods may scrape the run's /metrics.
    metrics_namespaces: tuple[str, ...] = ("monitoring",)
    # Namespaces (by name) of the cluster's DNS servers; empty: port 53 anywhere (a node-local
    # cache on a link-local address, say).
    dns_namespaces: tuple[str, ...] = ("kube-system",)
    # The API server's addresses (CIDRs) and ports as the pods reach it (the chart looks up the
    # `kubernetes` Service and its endpoints); no CIDRs: any address on these ports.
    api_server_cidrs: tuple[str, ...] = ()
    api_server_ports: tuple[int, ...] = (443, 6443)


def _selector(owner: Owner, role: str | None = None) -> dict[str, Any]:
    labels = {names.LABEL_RUN: owner.name}
    if role is not None:
        labels[names.LABEL_ROLE] = role
    return {"matchLabels": labels}


def _ports(numbers: tuple[int, ...] | list[int], protocol: str = "TCP") -> list[dict[str, Any]]:
    return [{"protocol": protocol, "port": port} for port in sorted(set(numbers))]


def _in_namespaces(namespaces: tuple[str, ...]) -> dict[str, Any]:
    return {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}
            ]
        }
    }


def dns_rule(network: NetworkSettings) -> dict[str, Any]:
    """DNS (UDP and TCP 53) to the DNS namespaces' pods, or anywhere where none are named."""
    rule: dict[str, Any] = {"ports": _ports([DNS_PORT], "UDP") + _ports([DNS_PORT])}
    if network.dns_namespaces:
        rule = {"to": [_in_namespaces(network.dns_namespaces)], **rule}
    return rule


def api_server_rule(network: NetworkSettings) -> dict[str, Any]:
    """The API server: its addresses on its ports (any address where none are known)."""
    to = [{"ipBlock": {"cidr": cidr}} for cidr in network.api_server_cidrs] or list(ANYWHERE)
    return {"to": to, "ports": _ports(network.api_server_ports)}


def run_policy(owner: Owner, network: NetworkSettings) -> dict[str, Any]:
    """Every pod of the run: reached by the run's own pods (and /metrics by the monitoring
    namespaces); reaches the run's own pods and DNS."""
    run_pods = _selector(owner)
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": run_pods}]}]
    if network.metrics_namespaces:
        monitoring = _in_namespaces(network.metrics_namespaces)
        ingress.append({"from": [monitoring], "ports": _ports([METRICS_PORT])})
    egress = [{"to": [{"podSelector": run_pods}]}, dns_rule(network)]
    return {
        "apiVersion": API,
        "kind": "NetworkPolicy",
        "metadata": owner.metadata(names.network_policy(owner.name), "network"),
        "spec": {
            "podSelector": run_pods,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def _url_ports(url: str) -> tuple[int, ...]:
    """The port an http(s) URL names, else its scheme's; () for a URL that is no server's (a
    file, a SQLite database); 443 for another scheme (databricks://...)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file", "sqlite") or "+" in scheme:  # a path, a file, an SQL store's driver
        return ()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        return (port,)
    return (80,) if scheme == "http" else (443,)


def tracker_ports(run: ScaleRLRun) -> tuple[int, ...]:
    """The outside ports the run's trackers log to (trainer and fit Job)."""
    tracking = run.spec.tracking
    if tracking is None:
        return ()
    out: list[int] = []
    if tracking.mlflow is not None:
        uri = tracking.mlflow.uri
        out += _url_ports(uri) if uri is not None else [80, 443, MLFLOW_PORT]
    if tracking.wandb is not None and tracking.wandb.mode == "online":
        out.append(443)
    if tracking.trackio is not None and tracking.secret_ref is not None:
        out.append(443)  # a Hugging Face Space, where the Secret names TRACKIO_SPACE_ID
    return tuple(sorted(set(out)))


def hub_ports(run: ScaleRLRun) -> tuple[int, ...]:
    """The Hub's port for the initializer, where the spec names hf:// sources."""
    if not sources.uses_hub(run):
        return ()
    endpoint = run.spec.hub.endpoint
    return _url_ports(endpoint) if endpoint is not None else (443,)


def rollout_ports(run: ScaleRLRun) -> tuple[int, ...]:
    """The outside ports of the pods that run rollouts: the package index of
    spec.environment.packages and spec.environment.openenv.url's server."""
    environment = run.spec.environment
    if environment is None:
        return ()
    out: list[int] = []
    if environment.packages:
        if environment.index_url is not None:
            out += _url_ports(environment.index_url)
        elif environment.index_secret is not None:
            out += [80, 443]  # the URL is in the Secret, which the operator does not read
        else:
            out.append(443)  # pip's default index, PyPI
    openenv = environment.openenv
    if openenv is not None and openenv.url is not None:
        out += _url_ports(openenv.url)
    return tuple(sorted(set(out)))


def egress_needs(run: ScaleRLRun, role: str) -> tuple[bool, tuple[int, ...]]:
    """(whether `role`'s pods call the API server, the outside ports they reach)."""
    ports: tuple[int, ...] = ()
    if role in (names.ROLE_TRAINER, names.ROLE_FIT):
        ports += tracker_ports(run)
    if role == names.ROLE_INITIALIZER:
        ports += hub_ports(run)
    if runs_rollouts(run, role):
        ports += rollout_ports(run)
    return role in API_ROLES, tuple(sorted(set(ports)))


def role_policy(
    run: ScaleRLRun, owner: Owner, role: str, network: NetworkSettings
) -> dict[str, Any] | None:
    """What `role`'s pods reach beyond the run's own pods and DNS; None where nothing."""
    if role == names.ROLE_INITIALIZER and not sources.uses_hub(run):
        return None  # no initializer Job
    if role == names.ROLE_GENERATOR and run.spec.colocated:
        return None  # no generator pods
    api, ports = egress_needs(run, role)
    egress = [api_server_rule(network)] if api else []
    if ports:
        egress.append({"to": [*ANYWHERE, {"namespaceSelector": {}}], "ports": _ports(ports)})
    if not egress:
        return None
    return {
        "apiVersion": API,
        "kind": "NetworkPolicy",
        "metadata": owner.metadata(names.egress_policy(owner.name, role), "network"),
        "spec": {
            "podSelector": _selector(owner, role),
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }


def network_policies(
    run: ScaleRLRun, owner: Owner, network: NetworkSettings
) -> list[dict[str, Any]]:
    """The run's NetworkPolicies (none where they are switched off)."""
    if not network.enabled:
        return []
    roles = [role_policy(run, owner, role, network) for role in EGRESS_ROLES]
    return [run_policy(owner, network), *(policy for policy in roles if policy is not None)]


def stale_policies(run: ScaleRLRun, owner: Owner, network: NetworkSettings) -> list[str]:
    """The role policies the run may have had and needs no more (its spec changed: the packages,
    the OpenEnv URL or the Hub ids went). None while policies are off: the operator then leaves
    the run's policies as they are, as it always has."""
    if not network.enabled:
        return []
    wanted = {p["metadata"]["name"] for p in network_policies(run, owner, network)}
    every = [names.egress_policy(owner.name, role) for role in EGRESS_ROLES]
    return [name for name in every if name not in wanted]
