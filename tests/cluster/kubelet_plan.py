"""How the test kubelet runs a pod on this machine: a pure translation of a Pod into the argv,
environment, files and ports of one local process.

In a cluster every pod has its own IP address and its own filesystem, so the same port numbers and
paths serve every pod. Here all processes share 127.0.0.1 and one filesystem, so the kubelet
virtualises both:

- Paths: every volumeMount's mountPath is a prefix rewritten to a local directory, wherever the
  pod names it: env values, args, the working directory, and the files of ConfigMap volumes (the
  run's spec names /models/..., /data/... in its ConfigMap).
- Names: a Service's DNS name (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) is
  127.0.0.1.
- Ports: a pod's declared container ports get free local ports of their own; a pod that backs a
  Service listens on the Service's local ports instead, which stay the same for the kubelet's
  life (so a restarted gang finds its trainer where the old one was). Port numbers travel in env
  variables apart from their host, so the kubelet is told which variable carries a port and which
  variable names that port's host (`PortVariables`; for ScaleRL: `SCALERL_PORTS`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scalerl.environment import ProcessEnv
from scalerl.ports import free_port

LOCALHOST = "127.0.0.1"
GPU = "nvidia.com/gpu"
# Port variable -> the variable naming the host that port is on (None: the pod's own port).
PortVariables = Mapping[str, str | None]
# ScaleRL's environment contract (scalerl/environment.py): trainer 0 serves the channel and the
# sync store at SCALERL_TRAINER_HOST; every process serves its own /metrics.
# Where a pod's processes listen ("0.0.0.0" in a real pod).
BIND_VARIABLE = "SCALERL_BIND_HOST"
SCALERL_PORTS: dict[str, str | None] = {
    "SCALERL_CHANNEL_PORT": "SCALERL_TRAINER_HOST",
    "SCALERL_SYNC_PORT": "SCALERL_TRAINER_HOST",
    "SCALERL_RANKS_PORT": "SCALERL_TRAINER_HOST",
    "SCALERL_METRICS_PORT": None,
}


class NotReady(Exception):  # noqa: N818 - the pod waits, as Kubernetes keeps it Pending
    """The pod cannot start yet (a missing claim, a GPU this node lacks); it stays Pending."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class Unsupported(Exception):  # noqa: N818 - a pod this test kubelet does not know how to run
    """A pod field this kubelet does not implement: a test error, not a pod failure."""


@dataclass
class Network:
    """Local ports for Service ports (stable) and for pods' own ports (fresh)."""

    service_ports: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def fresh_port(self) -> int:
        return free_port(LOCALHOST)

    def service_port(self, namespace: str, service: str, target: int) -> int:
        key = (namespace, service, target)
        if key not in self.service_ports:
            self.service_ports[key] = self.fresh_port()
        return self.service_ports[key]


@dataclass(frozen=True)
class ProcessPlan:
    """One container as a local process."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    files: dict[Path, str]  # written before the start: ConfigMap volumes, the kubeconfig
    dirs: list[Path]  # created before the start: emptyDirs, subPaths of claims
    listens: frozenset[int]  # local ports the process serves
    ports: frozenset[int]  # every local port it names (served or a peer's)


@dataclass(frozen=True)
class Credentials:
    """How a pod's process reaches the API server: its URL, the server's CA, and a token of the
    pod's ServiceAccount (pod -> token)."""

    url: str
    ca: Path
    token: Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Cluster:
    """What a plan reads from the API (a snapshot) and where local things live."""

    services: list[dict[str, Any]]
    config_maps: Callable[[str, str], dict[str, Any] | None]  # (namespace, name) -> ConfigMap
    secrets: Callable[[str, str], dict[str, Any] | None]  # (namespace, name) -> Secret
    claim_dir: Callable[[str, str], Path | None]  # (namespace, claim) -> directory or None
    credentials: Credentials


def plan_pod(
    pod: dict[str, Any],
    cluster: Cluster,
    network: Network,
    scratch: Path,
    base_env: Mapping[str, str],
    port_variables: PortVariables = SCALERL_PORTS,
) -> ProcessPlan:
    """The pod's only container as a process; NotReady or Unsupported when it cannot be one."""
    spec = pod["spec"]
    containers = spec.get("containers") or []
    if len(containers) != 1 or spec.get("initContainers"):
        raise Unsupported(f"pod {_name(pod)}: only pods of exactly one container are run")
    if spec.get("restartPolicy", "Always") != "Never":
        raise Unsupported(f"pod {_name(pod)}: only restartPolicy Never is run")
    container = containers[0]
    _check_resources(container)
    volumes, files, dirs = _volumes(pod, cluster, scratch)
    mounts = _mounts(container, volumes)
    dirs += [local for _, local in mounts]
    for path, text in list(files.items()):
        files[path] = rewrite_paths(text, mounts)
    own = _own_ports(pod, container, cluster.services, network)
    env = _environment(pod, container, cluster, mounts, own, network, port_variables)
    env = {**base_env, **env, "HOSTNAME": spec.get("hostname") or _name(pod)}
    env["TMPDIR"] = str(scratch / "tmp")
    dirs.append(scratch / "tmp")
    if spec.get("automountServiceAccountToken") is not False:
        # The service account's credentials, as a kubeconfig: in-cluster config needs HTTPS.
        kubeconfig = scratch / "kubeconfig"
        files[kubeconfig] = kubeconfig_text(cluster.credentials, pod)
        env["KUBECONFIG"] = str(kubeconfig)
    command = container.get("command")
    if not command:
        raise Unsupported(f"pod {_name(pod)}: the container needs a command (no image here)")
    argv = [rewrite_paths(a, mounts) for a in [*command, *container.get("args", [])]]
    workdir = container.get("workingDir")
    cwd = Path(rewrite_paths(workdir, mounts)) if workdir else scratch
    listens = frozenset(own.values())  # declared ports, and own ports the env names
    named = {int(env[v]) for v in port_variables if env.get(v, "").isdigit()}
    return ProcessPlan(argv, env, cwd, files, dirs, listens, frozenset(named) | listens)


def _name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _check_resources(container: dict[str, Any]) -> None:
    """This node has no GPU: a pod asking for one is unschedulable, as the scheduler says."""
    resources = container.get("resources") or {}
    asked = [(resources.get(kind) or {}).get(GPU, 0) for kind in ("requests", "limits")]
    if any(int(n or 0) for n in asked):
        raise NotReady("Unschedulable", f"0/1 nodes are available: 1 Insufficient {GPU}")


# --- volumes and paths ---------------------------------------------------------------------------


def _volumes(
    pod: dict[str, Any], cluster: Cluster, scratch: Path
) -> tuple[dict[str, Path], dict[Path, str], list[Path]]:
    """Volume name -> local directory; the files to write (ConfigMaps); the dirs to make."""
    namespace = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    files: dict[Path, str] = {}
    dirs: list[Path] = []
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        local = scratch / "volumes" / name
        if "emptyDir" in volume:
            dirs.append(local)
        elif "configMap" in volume:
            files.update(_config_map_files(namespace, volume["configMap"], cluster, local))
            dirs.append(local)
        elif "secret" in volume:
            files.update(_secret_files(namespace, volume["secret"], cluster, local))
            dirs.append(local)
        elif "projected" in volume:
            files.update(_projected_files(pod, volume["projected"], cluster, local))
            dirs.append(local)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            found = cluster.claim_dir(namespace, claim)
            if found is None:
                raise NotReady("Unschedulable", f'persistentvolumeclaim "{claim}" not found')
            local = found
        else:
            raise Unsupported(
                f"pod {_name(pod)}: volume {name}: only emptyDir, configMap, secret, projected, PVC"
            )
        out[name] = local
    return out, files, dirs


def _secret_files(
    namespace: str, source: dict[str, Any], cluster: Cluster, local: Path
) -> dict[Path, str]:
    """A Secret's keys (only `items`, when listed) as files, decoded as the kubelet does."""
    found = cluster.secrets(namespace, source["secretName"])
    if found is None:
        raise NotReady("CreateContainerConfigError", f'secret "{source["secretName"]}" not found')
    data = found.get("data") or {}
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    files = {}
    for item in items:
        if item["key"] not in data:
            raise NotReady(
                "CreateContainerConfigError",
                f'secret "{source["secretName"]}" has no key "{item["key"]}"',
            )
        files[local / item["path"]] = base64.b64decode(data[item["key"]]).decode()
    return files


def _projected_files(
    pod: dict[str, Any], projected: dict[str, Any], cluster: Cluster, local: Path
) -> dict[Path, str]:
    """A projected volume, as the ServiceAccount admission plugin adds one to every pod that
    mounts its token (`kube-api-access-*`): the token, the cluster's CA, the namespace."""
    namespace = pod["metadata"]["namespace"]
    files: dict[Path, str] = {}
    for source in projected.get("sources") or []:
        if "serviceAccountToken" in source:
            files[local / source["serviceAccountToken"]["path"]] = cluster.credentials.token(pod)
        elif "configMap" in source:
            ref = source["configMap"]
            found = cluster.config_maps(namespace, ref["name"])
            if found is None:
                raise NotReady("ContainerCreating", f'configmap "{ref["name"]}" not found')
            data = found.get("data") or {}
            for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                files[local / item["path"]] = data[item["key"]]
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                value = field_value(pod, item["fieldRef"]["fieldPath"])
                files[local / item["path"]] = value
        else:
            raise Unsupported(f"pod {_name(pod)}: projected source {sorted(source)}")
    return files


def _config_map_files(
    namespace: str, source: dict[str, Any], cluster: Cluster, local: Path
) -> dict[Path, str]:
    if source.get("items"):
        raise Unsupported("configMap volumes with items are not implemented")
    found = cluster.config_maps(namespace, source["name"])
    if found is None:
        if source.get("optional"):
            return {}
        raise NotReady("CreateContainerConfigError", f'configmap "{source["name"]}" not found')
    return {local / key: text for key, text in (found.get("data") or {}).items()}


def _mounts(container: dict[str, Any], volumes: dict[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, local directory), longest mountPath first (so /a/b wins over /a)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        local = volumes[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
        mounts.append((mount["mountPath"].rstrip("/") or "/", local))
    return sorted(mounts, key=lambda m: len(m[0]), reverse=True)


def rewrite_paths(text: str, mounts: list[tuple[str, Path]]) -> str:
    """Every mount path that starts a path in `text` (not inside a longer name) made local."""
    for mount_path, local in mounts:
        pattern = rf"(?<![\w./-]){re.escape(mount_path)}(?=/|$|[^\w.-])"
        text = re.sub(pattern, lambda _m, local=local: str(local), text)
    return text


# --- names and ports -----------------------------------------------------------------------------


def service_of(host: str, namespace: str, services: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Service a DNS name stands for, as cluster DNS would resolve it from `namespace`."""
    for service in services:
        meta = service["metadata"]
        name, ns = meta["name"], meta["namespace"]
        names = {f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"}
        if host in names or (host == name and ns == namespace):
            return service
    return None


def _selects(service: dict[str, Any], pod: dict[str, Any]) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    same_namespace = service["metadata"]["namespace"] == pod["metadata"]["namespace"]
    matching = all(labels.get(k) == v for k, v in selector.items())
    return bool(selector) and same_namespace and matching


def _target(service: dict[str, Any], port: int) -> int:
    """The container port that `port` of the Service reaches (headless: the port itself)."""
    for entry in (service.get("spec") or {}).get("ports") or []:
        if entry.get("port") == port:
            target = entry.get("targetPort", port)
            if isinstance(target, str):
                raise Unsupported(f"Service port {port}: named targetPorts are not implemented")
            return int(target)
    return port


def _own_ports(
    pod: dict[str, Any],
    container: dict[str, Any],
    services: list[dict[str, Any]],
    network: Network,
) -> dict[int, int]:
    """Container port -> the local port this pod serves it on."""
    backing = [s for s in services if _selects(s, pod)]
    namespace = pod["metadata"]["namespace"]
    own = {}
    for entry in container.get("ports") or []:
        port = int(entry["containerPort"])
        if backing:  # clients find it through the Service: use the Service's local port
            own[port] = network.service_port(namespace, backing[0]["metadata"]["name"], port)
        else:
            own[port] = network.fresh_port()
    return own


def _environment(
    pod: dict[str, Any],
    container: dict[str, Any],
    cluster: Cluster,
    mounts: list[tuple[str, Path]],
    own: dict[int, int],
    network: Network,
    port_variables: PortVariables,
) -> dict[str, str]:
    """The container's env, made local: paths, Service names, then the port variables."""
    namespace = pod["metadata"]["namespace"]
    resolved: dict[str, str] = {}
    for var in container.get("env") or []:
        value = var["value"] if "value" in var else _value_from(pod, var.get("valueFrom"), cluster)
        if value is not None:
            resolved[var["name"]] = str(value)
    env = {
        name: LOCALHOST if service_of(value, namespace, cluster.services) else value
        for name, value in ((n, rewrite_paths(v, mounts)) for n, v in resolved.items())
    }
    if BIND_VARIABLE in env:  # the pod network is this machine's loopback: listen there only
        env[BIND_VARIABLE] = LOCALHOST
    for variable, host_variable in port_variables.items():
        if not env.get(variable, "").isdigit() or int(env[variable]) == 0:
            continue
        port = int(env[variable])
        host = resolved.get(host_variable) if host_variable else None
        peer = service_of(host, namespace, cluster.services) if host else None
        if peer is not None:  # a port of the pod behind that Service
            target = _target(peer, port)
            local = network.service_port(namespace, peer["metadata"]["name"], target)
        else:  # the pod's own port (declared or not, it gets a local port of its own)
            if port not in own:
                own[port] = network.fresh_port()
            local = own[port]
        env[variable] = str(local)
    return env


def _value_from(pod: dict[str, Any], source: dict[str, Any] | None, cluster: Cluster) -> str | None:
    """valueFrom: the downward API (fieldRef) and configMapKeyRef."""
    if source is None:
        return None
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        found = cluster.config_maps(pod["metadata"]["namespace"], ref["name"]) or {}
        value = (found.get("data") or {}).get(ref["key"])
        if value is None and not ref.get("optional"):
            missing = f"configmap key {ref['name']}/{ref['key']} not found"
            raise NotReady("CreateContainerConfigError", missing)
        return value
    raise Unsupported(f"valueFrom {sorted(source)} is not implemented")


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: dict[str, Any], path: str) -> str:
    """A downward-API fieldPath of the pod, as the kubelet resolves it."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": LOCALHOST,
        "status.hostIP": LOCALHOST,
    }
    if path in simple:
        return str(simple[path] or "")
    match = _FIELD.match(path)
    if match is None:
        raise Unsupported(f"fieldRef {path!r} is not implemented")
    return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))


def kubeconfig_text(credentials: Credentials, pod: dict[str, Any]) -> str:
    """What a pod's service account gives its process: the API, as that account, in its
    namespace. (A pod reads the same from /var/run/secrets/kubernetes.io/serviceaccount; a
    process here cannot have that path of its own, and our client reads a kubeconfig the same.)"""
    namespace = pod["metadata"]["namespace"]
    account = pod["spec"].get("serviceAccountName", "default")
    user = f"system:serviceaccount:{namespace}:{account}"
    cluster = {"server": credentials.url, "certificate-authority": str(credentials.ca)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "pod",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": credentials.token(pod)}}],
        "contexts": [
            {"name": "pod", "context": {"cluster": "cluster", "user": user, "namespace": namespace}}
        ],
    }
    return yaml.safe_dump(config)


def contract_port_variables() -> set[str]:
    """The port variables of scalerl.environment's contract, to check SCALERL_PORTS against."""
    env = ProcessEnv(Path("/s"), Path("/r"), "h", 1, 2, 3, 4).to_environ()
    return {name for name in env if name.endswith("_PORT")}
