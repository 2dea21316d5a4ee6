"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built from Go modules (tests/cluster/bins.py), as a cluster has them.

The API server authorizes with Node and RBAC, admits with the defaults (ServiceAccount,
NamespaceLifecycle, PodSecurity, ResourceQuota, ...) plus OwnerReferencesPermissionEnforcement, and
signs ServiceAccount tokens; the controller manager runs the Job, garbage-collector, namespace,
service-account, token, ttl-after-finished, resource-quota, Deployment and ReplicaSet controllers.
The scheduler schedules only the pods that name it (`schedulerName: TEST_SCHEDULER`), so a test
can meet its answers (Unschedulable, with its message) while the others bind and run pods
themselves (no kubelet). One Node object exists, with no labels or capacity, and the not-ready
taint the API server gives a new node.

    plane = ControlPlane.start(bins, work_dir)
    plane.namespace("t1")          # labelled pod-security enforce=restricted; its default SA ready
    plane.kubectl("get", "ns")     # the kubectl built with it, as the admin
    plane.stop()
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.ports import free_port

# as_run(name, spec) -> the ServiceAccount user this process now connects as (tests/cluster)
RunAccount = Callable[[str, dict[str, Any]], str]
ADMIN_TOKEN = "scalerl-test-admin-token"
NODE = "test-node"
TEST_SCHEDULER = "scalerl-test-scheduler"
START_TIMEOUT_S = 90.0
CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller",
    "resourcequota-controller",
    # The chart's operator Deployment: its pod, which the end-to-end test runs from the image.
    "deployment-controller",
    "replicaset-controller",
)


# client-go's default number of retries of a request the server answered 429 with Retry-After.
RETRIES_429 = 10


@dataclass
class ControlPlane:
    bins: Path
    work: Path
    url: str
    ca: Path
    kubeconfig: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_s: float = 0.0
    made: list[str] = field(default_factory=list)  # the namespaces namespace() created, in order

    @classmethod
    def start(cls, bins: Path, work: Path) -> ControlPlane:
        started = time.monotonic()
        work.mkdir(parents=True, exist_ok=True)
        certs = work / "certs"
        certs.mkdir(exist_ok=True)
        sa_key = certs / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
        )
        tokens = work / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        url = f"https://127.0.0.1:{api_port}"
        plane = cls(bins, work, url, certs / "apiserver.crt", work / "admin.kubeconfig")
        plane.spawn(
            "etcd",
            "--data-dir",
            str(work / "etcd"),
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        )
        plane.spawn(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={certs}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            f"--token-auth-file={tokens}",
            "--endpoint-reconciler-type=none",
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            f"--audit-log-path={work / 'audit.log'}",
            f"--audit-policy-file={plane.audit_policy()}",
        )
        plane.wait_ready()
        plane.write_kubeconfig()
        plane.spawn(
            "kube-controller-manager",
            f"--kubeconfig={plane.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={plane.ca}",
        )
        plane.spawn("kube-scheduler", f"--config={plane.scheduler_config()}", "--secure-port=0")
        plane.api("POST", "/api/v1/nodes", {"metadata": {"name": NODE}})
        plane.started_s = time.monotonic() - started
        return plane

    def scheduler_config(self) -> Path:
        path = self.work / "scheduler.yaml"
        path.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
            f"clientConnection: {{kubeconfig: {self.kubeconfig}}}\n"
            "leaderElection: {leaderElect: false}\n"
            f"profiles: [{{schedulerName: {TEST_SCHEDULER}}}]\n"
        )
        return path

    def audit_policy(self) -> Path:
        """Every request's metadata: what a run costs the API server, counted by the server."""
        path = self.work / "audit-policy.yaml"
        path.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
            "rules:\n- level: Metadata\n"
        )
        return path

    def spawn(self, name: str, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [str(self.bins / name), *args], stdout=log, stderr=subprocess.STDOUT
        )

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str = ADMIN_TOKEN,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One request as the admin (or `token`): (status, decoded JSON body).

        A 429 with `retryAfterSeconds` is the server asking to come back (a CRD's storage still
        initializing just after the CRD is Established): asked again after that wait, up to
        `RETRIES_429` times, as client-go does."""
        data = None if body is None else json.dumps(body).encode()
        for _ in range(RETRIES_429):
            request = urllib.request.Request(self.url + path, data=data, method=method)
            request.add_header("Authorization", f"Bearer {token}")
            if data is not None:
                request.add_header("Content-Type", content_type)
            try:
                with urllib.request.urlopen(request, context=self.context(), timeout=30) as reply:
                    return reply.status, _decoded(reply.read())
            except urllib.error.HTTPError as err:
                code, got = err.code, _decoded(err.read())
            wait = (got.get("details") or {}).get("retryAfterSeconds") if code == 429 else None
            if wait is None:
                return code, got
            time.sleep(float(wait))
        return code, got

    def api_patch(self, path: str, body: Any) -> tuple[int, Any]:
        """A merge patch as the admin."""
        return self.api("PATCH", path, body, content_type="application/merge-patch+json")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    tail = (self.work / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
            if self.ca.exists():
                try:
                    ready, _ = self.api("GET", "/readyz")
                    names = [self.api("GET", f"/api/v1/namespaces/{n}")[0] for n in NAMESPACES]
                    if ready == 200 and names == [200] * len(NAMESPACES):
                        return
                except (OSError, ValueError):
                    pass  # not listening yet, or still writing its certificate
            time.sleep(0.2)
        raise RuntimeError(f"the API server was not ready within {START_TIMEOUT_S:.0f} s")

    def write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }
        self.kubeconfig.write_text(json.dumps(config))

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done.stdout if check else done.stdout + done.stderr

    def namespace(self, name: str, enforce: str = "restricted") -> str:
        """A fresh namespace with Pod Security `enforce`, once its default ServiceAccount exists
        (the ServiceAccount admission plugin refuses pods until then)."""
        labels = {"pod-security.kubernetes.io/enforce": enforce}
        code, body = self.api(
            "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}
        )
        if code != 201:
            raise AssertionError(f"namespace {name}: {code} {body}")
        self.made.append(name)
        deadline = time.monotonic() + 30
        while self.api("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"no default ServiceAccount in {name} after 30 s")
            time.sleep(0.1)
        return name

    def clear_runs(self, namespaces: list[str]) -> None:
        """Remove every ScaleRLSweep and ScaleRLRun of `namespaces` at once, finalizers first.

        A test's runs outlive its operator (kopf stops with their finalizers on), and an operator
        started later for every namespace adopts them all: with its periodic check every second
        it reconciled (and restarted the timed-out gangs of) some twenty runs of earlier tests,
        and its own run's deletion waited for them. The garbage collector takes their children."""
        for namespace in namespaces:
            for resource in ("scalerlsweeps", "scalerlruns"):
                path = f"/apis/scalerl.dev/v1alpha1/namespaces/{namespace}/{resource}"
                code, found = self.api("GET", path)
                if code == 404:  # the CRD is not installed (yet)
                    continue
                assert code == 200, found
                for item in found["items"]:
                    one = f"{path}/{item['metadata']['name']}"
                    code, body = self.api_patch(one, {"metadata": {"finalizers": None}})
                    assert code in (200, 404), body
                    code, body = self.api("DELETE", one)
                    assert code in (200, 202, 404), body

    def runs_anywhere(self) -> list[str]:
        """`namespace/name` of every ScaleRLRun and ScaleRLSweep in the cluster."""
        out = []
        for resource in ("scalerlsweeps", "scalerlruns"):
            code, found = self.api("GET", f"/apis/scalerl.dev/v1alpha1/{resource}")
            if code == 404:
                continue
            assert code == 200, found
            out += [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in found["items"]]
        return out

    def token(self, namespace: str, account: str) -> str:
        """A token of ServiceAccount `account` (the TokenRequest API, as a kubelet gets one)."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        code, body = self.api("POST", path, request)
        if code != 201:
            raise AssertionError(f"token of {namespace}/{account}: {code} {body}")
        return str(body["status"]["token"])

    def audit(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (one per request, at ResponseComplete)."""
        text = (self.work / "audit.log").read_text()
        # The server may be writing an event as we read: its line is complete only once its
        # newline is written, so what follows the last newline is read next time.
        whole = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def stop(self) -> None:
        stop_processes(list(reversed(self.processes.values())))


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each, in this order, then wait for all; kill one that is not gone in 15 s."""
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in processes:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


NAMESPACES = ("default", "kube-system")


def _decoded(raw: bytes) -> Any:
    """A JSON body decoded; a plain one (`/readyz` says "ok") as text."""
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return raw.decode(errors="replace")


def environ_for(plane: ControlPlane) -> dict[str, str]:
    """A process environment whose kubectl, kopf and Kubernetes client find the cluster."""
    return {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
