"""Kueue and JobSet on the real control plane, as their releases install them: their CRDs, their
admission webhooks (mutating and validating) and Kueue's CRD conversion webhook, served by the
real controllers built from Go modules (tests/cluster/bins.py).

A cluster reaches a webhook through a Service and trusts it by a caBundle. This one has no
Service network: Kueue's Service is an ExternalName one for localhost (the API server dials the
name and checks the certificate against the Service's DNS name), and Kueue manages its own
certificate as released (it writes the Service's name into it and the caBundles into its
webhook configurations and CRDs). JobSet's webhooks name its address on 127.0.0.1 instead, with
a CA made here. Everything else is the released manifests.

    with Queues.start(plane, work_dir) as queues:
        queues.cluster_queue("team", {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"})
        queues.local_queue(ns, "gpus", "team")
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bins
import yaml
from controlplane import ControlPlane, stop_processes
from runs import established

from scalerl.ports import free_port

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SERVICE = "kueue-webhook-service"  # Kueue's defaults (internalCertManagement)
KUEUE_SECRET = "kueue-webhook-server-cert"
START_S = 90.0
# What a cluster's Kueue typically integrates (its default list, less frameworks whose CRDs
# this cluster has not: MPIJob, Ray, AppWrapper, Kubeflow's); "pod" is left out too, so plain
# pods of the other tests never meet Kueue's pod webhook.
FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
# The Kueue webhooks for what these frameworks and Kueue's own objects need.
KUEUE_WEBHOOK_RESOURCES = {
    "jobs",
    "jobsets",
    "workloads",
    "clusterqueues",
    "localqueues",
    "resourceflavors",
    "cohorts",
}


@dataclass
class Queues:
    plane: ControlPlane
    work: Path
    ca_bundle: str
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    webhook_configs: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    mounted: dict[str, str] = field(default_factory=dict)  # the Secret's data, as projected
    started_s: float = 0.0

    @classmethod
    @contextmanager
    def start(cls, plane: ControlPlane, work: Path) -> Iterator[Queues]:
        work.mkdir(parents=True, exist_ok=True)
        ports = {"kueue": free_port(), "jobset": free_port()}
        queues = cls(plane, work, _certificates(work / "jobset"), ports)
        began = time.monotonic()
        try:
            queues.install()
            queues.spawn("jobset", queues.jobset_config())
            queues.spawn("kueue", queues.kueue_config(), "--feature-gates=VisibilityOnDemand=false")
            queues.wait_serving()
            queues.started_s = time.monotonic() - began
            yield queues
        finally:
            queues.stop()

    # --- installing --------------------------------------------------------------------------

    def install(self) -> None:
        """The CRDs and webhook configurations, pointed at 127.0.0.1 (see the module's text)."""
        self.plane.namespace(KUEUE_NAMESPACE, enforce="privileged")
        for obj in (
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": KUEUE_SECRET}},
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": KUEUE_SERVICE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
        ):
            obj["metadata"]["namespace"] = KUEUE_NAMESPACE
            self.apply(obj)
        for name in ("jobset", "kueue"):
            crds = bins.controller_source(name) / "config/components/crd"
            converted = _converted(crds) if name == "kueue" else set()
            for path in sorted((crds / "bases").glob("*.yaml")):
                crd = yaml.safe_load(path.read_text())
                if crd["metadata"]["name"] in converted:
                    crd["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": self.client_config("kueue", "/convert"),
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                self.apply(crd)
                established(self.plane, crd["metadata"]["name"])
        for name in ("jobset", "kueue"):
            manifests = bins.controller_source(name) / "config/components/webhook/manifests.yaml"
            for config in yaml.safe_load_all(manifests.read_text()):
                if config:
                    self.apply(self.webhook_config(name, config))

    def webhook_config(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        webhooks = []
        for hook in config["webhooks"]:
            resources = {r for rule in hook.get("rules", []) for r in rule["resources"]}
            if name == "kueue" and not resources & KUEUE_WEBHOOK_RESOURCES:
                continue
            if name == "jobset" and "pods" in resources:
                # JobSet's pod webhooks act only on its own pods (its kustomize patch says so).
                selector = {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}
                hook["objectSelector"] = {"matchExpressions": [selector]}
            if name == "kueue":
                excluded = ["kube-system", KUEUE_NAMESPACE]
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": excluded,
                        }
                    ]
                }
            hook["clientConfig"] = self.client_config(name, hook["clientConfig"]["service"]["path"])
            webhooks.append(hook)
        config["metadata"] = {"name": f"{name}-{config['metadata']['name']}"}
        config["webhooks"] = webhooks
        self.webhook_configs.append((config["kind"], config["metadata"]["name"]))
        return config

    def client_config(self, name: str, path: str) -> dict[str, Any]:
        if name == "kueue":  # its caBundle is Kueue's to write
            service = {"name": KUEUE_SERVICE, "namespace": KUEUE_NAMESPACE}
            return {"service": {**service, "path": path, "port": self.ports[name]}}
        return {"url": f"https://127.0.0.1:{self.ports[name]}{path}", "caBundle": self.ca_bundle}

    def apply(self, obj: dict[str, Any]) -> None:
        self.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(obj))

    # --- the controllers ---------------------------------------------------------------------

    def common_config(self, name: str) -> dict[str, Any]:
        certs = self.work / name
        return {
            "webhook": {"port": self.ports[name], "host": "127.0.0.1", "certDir": str(certs)},
            "internalCertManagement": {"enable": name == "kueue"},
            "leaderElection": {"leaderElect": False},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": "0"},
        }

    def jobset_config(self) -> Path:
        body = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            **self.common_config("jobset"),
        }
        return self.write_config("jobset", body)

    def kueue_config(self) -> Path:
        body = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            **self.common_config("kueue"),
            "integrations": {"frameworks": list(FRAMEWORKS)},
        }
        return self.write_config("kueue", body)

    def write_config(self, name: str, body: dict[str, Any]) -> Path:
        path = self.work / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(body))
        return path

    def spawn(self, name: str, config: Path, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [
                str(bins.controller_binary(name)),
                f"--config={config}",
                f"--kubeconfig={self.plane.kubeconfig}",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_serving(self) -> None:
        """Both webhook servers answer TLS with a certificate their webhooks trust: JobSet's
        made here, Kueue's the one it made for its Service (its CA in the webhooks' caBundle)."""
        deadline = time.monotonic() + START_S
        waiting = dict(self.ports)
        while waiting:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            self.mount_kueue_secret()
            for name, port in list(waiting.items()):
                bundle, host = self.trusted(name)
                if not bundle:
                    continue
                context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as raw:
                        with context.wrap_socket(raw, server_hostname=host):
                            del waiting[name]
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"not serving within {START_S:.0f} s: {', '.join(waiting)}")
            time.sleep(0.2)

    def mount_kueue_secret(self) -> None:
        """What the kubelet does for Kueue's pod: its certificate Secret, once Kueue wrote it,
        as files in its certificate directory (Kueue waits to see them there)."""
        path = f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets/{KUEUE_SECRET}"
        code, secret = self.plane.api("GET", path)
        assert code == 200, secret
        data = secret.get("data") or {}
        if data and data != self.mounted:
            _project(self.work / "kueue", {k: base64.b64decode(v) for k, v in data.items()})
            self.mounted = data

    def trusted(self, name: str) -> tuple[str | None, str]:
        """(the caBundle the API server trusts for `name`'s webhooks, the name it checks)."""
        if name == "jobset":
            return self.ca_bundle, "127.0.0.1"
        path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        code, config = self.plane.api("GET", f"{path}/kueue-mutating-webhook-configuration")
        assert code == 200, config
        bundle = config["webhooks"][0]["clientConfig"].get("caBundle")
        return bundle, f"{KUEUE_SERVICE}.{KUEUE_NAMESPACE}.svc"

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Webhook configurations first: a webhook that fails closed would refuse every later
        test's Jobs once its server is gone."""
        for kind, name in self.webhook_configs:
            self.plane.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        stop_processes(list(self.processes.values()))

    # --- quota, as a cluster admin sets it up ------------------------------------------------

    def cluster_queue(self, name: str, quota: dict[str, str]) -> None:
        """A ClusterQueue for every namespace with `quota` of one ResourceFlavor "default"."""
        self.apply(
            {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "default"}}
        )
        self.apply(
            {
                "apiVersion": KUEUE_API,
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": sorted(quota),
                            "flavors": [
                                {
                                    "name": "default",
                                    "resources": [
                                        {"name": r, "nominalQuota": q}
                                        for r, q in sorted(quota.items())
                                    ],
                                }
                            ],
                        }
                    ],
                },
            }
        )

    def local_queue(self, namespace: str, name: str, cluster_queue: str) -> None:
        self.apply(
            {
                "apiVersion": KUEUE_API,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            }
        )

    def activate(self, workload: dict[str, Any], active: bool) -> None:
        """As an admin: `spec.active` of a Workload (false: Kueue evicts it and holds it)."""
        meta = workload["metadata"]
        path = f"/apis/{KUEUE_API}/namespaces/{meta['namespace']}/workloads/{meta['name']}"
        code, body = self.plane.api_patch(path, {"spec": {"active": active}})
        assert code == 200, body

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        code, found = self.plane.api("GET", f"/apis/{KUEUE_API}/namespaces/{namespace}/workloads")
        assert code == 200, found
        return list(found["items"])


def _project(directory: Path, files: dict[str, bytes]) -> None:
    """Project `files` into `directory` at once, as the kubelet's atomic writer does: a new
    timestamped directory, the `..data` link swapped to it, each name a link through `..data`.
    A reader never sees a file half written, nor a certificate beside another's key (Kueue read
    an empty tls.crt once, when files were rewritten in place, and exited)."""
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.time_ns()}"
    version.mkdir()
    for name, content in files.items():
        (version / name).write_bytes(content)
    swap = directory / "..data_tmp"
    swap.unlink(missing_ok=True)
    swap.symlink_to(version.name)
    previous = (directory / "..data").resolve() if (directory / "..data").is_symlink() else None
    os.replace(swap, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    if previous is not None:
        shutil.rmtree(previous)


def _converted(crds: Path) -> set[str]:
    """The CRDs Kueue's release serves through its conversion webhook: those its kustomization
    patches (commented-out patches are not in the YAML)."""
    kustomization = yaml.safe_load((crds / "kustomization.yaml").read_text())
    patches = [yaml.safe_load((crds / p["path"]).read_text()) for p in kustomization["patches"]]
    return {patch["metadata"]["name"] for patch in patches if "conversion" in patch["spec"]}


def _certificates(work: Path) -> str:
    """A CA, and a serving certificate for 127.0.0.1 signed by it (tls.crt, tls.key in `work`,
    where controller-runtime looks); the CA as a caBundle."""

    work.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=scalerl-test-webhook-ca",
        "-days",
        "2",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (work / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    )
    return base64.b64encode((work / "ca.crt").read_bytes()).decode()
