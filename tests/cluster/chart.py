"""The chart installed the way users install it (`helm install`), and the operator run as the
chart's ServiceAccount: every request it makes is authorized by the chart's ClusterRole, by the
real API server.

Two ways to run the operator:
- `Operator`: `scalerl operator` as a process of its own, as the chart's Deployment runs it
  (restartable, killable);
- `in_thread(plane, kubeconfig, namespaces=[ns])`: kopf in a thread of the test, with the same
  handlers registered in a registry of its own, watching only the test's namespace (so tests do
  not act on each other's runs), or every namespace (`[]`, as the chart's default values run it),
  and optionally a `RunMetrics` to read the exported gauges from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane import ControlPlane

from scalerl.kube import Kube
from scalerl.metrics import RunMetrics
from scalerl.operator.manifests import Images

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "scalerl"
RELEASE, RELEASE_NAMESPACE = "scalerl", "scalerl-system"
OPERATOR_ACCOUNT = "scalerl"  # the chart's ServiceAccount (its fullname)
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{OPERATOR_ACCOUNT}"
START_S = 60.0


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The helm CLI built with the control plane, as the admin."""
    return subprocess.run(
        [str(plane.bins / "helm"), f"--kubeconfig={plane.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def install(plane: ControlPlane, work: Path) -> Path:
    """`helm install` of the chart (once per control plane) and a kubeconfig holding a token of
    the chart's ServiceAccount: what the operator's pod would be given."""
    listed = helm(plane, "status", RELEASE, "-n", RELEASE_NAMESPACE)
    if listed.returncode != 0:
        done = helm(
            plane, "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace"
        )
        if done.returncode != 0:
            raise AssertionError(f"helm install failed: {done.stderr}")
    return account_kubeconfig(plane, RELEASE_NAMESPACE, OPERATOR_ACCOUNT, work)


def account_kubeconfig(plane: ControlPlane, namespace: str, account: str, work: Path) -> Path:
    """A kubeconfig holding a token of ServiceAccount `namespace/account`."""
    config = json.loads(plane.kubeconfig.read_text())
    token = plane.token(namespace, account)
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    kubeconfig = work / f"{namespace}-{account}.kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    return kubeconfig


def kube_from(kubeconfig: Path, agent: str) -> Kube:
    """Our client, connected with one kubeconfig (not the process's KUBECONFIG)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    api = client.ApiClient(configuration)
    api.user_agent = f"{agent}/test"
    return Kube(api)


class Operator:
    """`scalerl operator` as a process of its own, connected with `kubeconfig`; restartable."""

    def __init__(self, kubeconfig: Path, log: Path, *args: str) -> None:
        self.kubeconfig, self.log, self.args = kubeconfig, log, args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scalerl.cli", "operator", *self.args],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def refused(self) -> list[str]:
        """Lines of its log where the API server said 403."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if "forbidden" in line.lower()]


@dataclass
class OperatorThread:
    stop_flag: threading.Event = field(default_factory=threading.Event)
    ready_flag: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)


@contextlib.contextmanager
def in_thread(
    plane: ControlPlane,
    kubeconfig: Path,
    namespaces: list[str],
    *,
    metrics: RunMetrics | None = None,
    check_interval_s: float = 3600.0,
    sweep_interval_s: float | None = None,
    images: Images | None = None,
) -> Iterator[OperatorThread]:
    """The operator's handlers in kopf, in a thread, as the chart's ServiceAccount.

    The periodic checks are off by default: tests prove the event-driven paths. A sweep acts on
    its periodic check only (`sweep_interval_s`, default the runs')."""
    import kopf

    from scalerl.operator.handlers import register
    from scalerl.operator.main import only_these_namespaces

    if not namespaces:
        # It would adopt every run in the cluster, not only the test's (ControlPlane.clear_runs).
        left = plane.runs_anywhere()
        assert not left, f"runs of earlier tests left for an operator of every namespace: {left}"
    registry = kopf.OperatorRegistry()
    register(registry, check_interval_s=check_interval_s, sweep_interval_s=sweep_interval_s)
    only_these_namespaces(registry, namespaces)
    user = json.loads(kubeconfig.read_text())["users"][0]["user"]

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=plane.url, ca_path=str(plane.ca), token=user["token"])

    memo = kopf.Memo(kube=kube_from(kubeconfig, "scalerl-operator"), images=images or Images())
    if metrics is not None:
        memo.metrics = metrics
    handle = OperatorThread()

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    namespaces=namespaces,
                    clusterwide=not namespaces,
                    standalone=True,
                    memo=memo,
                    stop_flag=handle.stop_flag,
                    ready_flag=handle.ready_flag,
                )
            )
        except BaseException as exc:  # the test sees it at exit
            handle.errors.append(exc)

    thread = threading.Thread(target=run, name="kopf-operator", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not (handle.ready_flag.is_set() or handle.errors) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield handle
    finally:
        handle.stop_flag.set()
        thread.join(START_S)
    assert not thread.is_alive(), "the operator did not stop"
    assert not handle.errors, f"the operator failed: {handle.errors!r}"
