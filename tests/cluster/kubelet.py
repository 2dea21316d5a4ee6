"""A test kubelet for the real API server: binds its namespace's pods to the control plane's Node,
runs each as a local process, and keeps the pod's status true to that process.

What a kubelet (and, here, the scheduler) does, through the API as they do it:
- a Pending pod of the namespace is bound to the Node (`pods/binding`), unless it cannot run here
  (a GPU, a missing claim or ConfigMap: it stays Pending, and its PodScheduled condition says why);
- its only container runs as a local process (see kubelet_plan.py for how paths, Service names and
  ports are made local) in a process group of its own, with stdout and stderr in a log file, and
  with a token of its ServiceAccount from the TokenRequest API, bound to the pod, in the
  kubeconfig its Kubernetes client reads; or, where its image is one the kubelet was given
  (`images`), in that image with Podman (containers.py), the same plan made into `podman run`;
- `pods/status` follows the process: Running and Ready once it started, then Succeeded or Failed
  with the container's exit code (128 + signal when killed, as container runtimes report it); a
  pod with restartPolicy Always (a Deployment's) has its container started again instead, in the
  same pod, its restartCount counting;
- a deleted pod gets SIGTERM, then SIGKILL after its grace period (capped: tests wait on it); once
  its process is gone its status says how it ended and the kubelet deletes it for good
  (`gracePeriodSeconds: 0`), as the real server waits for a kubelet to do. When a container's main
  process ends, the rest of its group is killed, as a container's are.

Leaks are checked, not assumed away: every process carries a marker in its environment, which its
descendants inherit even when they leave the process group, and at exit the kubelet looks for any
process still carrying it (`leftovers`). A process is also sent SIGKILL should the kubelet's thread
die (`setpriv --pdeathsig`), so a test killed mid-way leaves nothing either.

    with Kubelet(plane, ns) as kubelet:
        kubelet.claim_dir("store")           # a PVC's directory, to stage files in
        ...
        os.kill(kubelet.pid(pod_name), signal.SIGKILL)
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import containers
from controlplane import NODE, ControlPlane
from kubelet_plan import (
    LOCALHOST,
    SCALERL_PORTS,
    Cluster,
    Credentials,
    Network,
    NotReady,
    PortVariables,
    ProcessPlan,
    Unsupported,
    plan_pod,
)

MARKER = "TEST_KUBELET_ID"  # in every process's environment: what leftovers() looks for
DEFAULT_GRACE_S = 30.0  # terminationGracePeriodSeconds when a pod does not say
MAX_GRACE_S = 10.0
TICK_S = 0.2  # the namespace's pods and the processes are polled this often
SETPRIV = shutil.which("setpriv")
# The "image" is this machine: its environment, less what would steer a process past its pod's.
HOST_ONLY = ("SCALERL_", "KUBERNETES_", "VLLM_", "KUBECONFIG", "JOB_COMPLETION_INDEX", MARKER)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    """A container's exit code: a process killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Container:
    """One pod's process. Only the kubelet's thread polls and signals it (until it stopped)."""

    pod: str
    namespace: str
    uid: str
    plan: ProcessPlan
    process: subprocess.Popen[bytes]
    grace_s: float
    started: str  # when the process started, as the pod's status says it
    kill_at: float | None = None  # set once the pod is deleted
    finished: bool = False  # the main process ended and was reaped: never signal its group again
    image_name: str | None = None  # the Podman container's name, where it runs in an image
    always: bool = False  # restartPolicy Always: started again when it ends
    restarts: int = 0
    argv: list[str] = field(default_factory=list)  # how it was started: a restart does the same
    env: dict[str, str] = field(default_factory=dict)

    def main_ended(self) -> bool:
        """Whether the main process ended, without reaping it: while it is a zombie its pid, the
        group's id, cannot be reused, so signalling the group still reaches only its own."""
        try:
            return (
                os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                is not None
            )
        except ChildProcessError:
            return True

    def signal_group(self, sig: signal.Signals) -> None:
        if self.finished:
            return
        if self.image_name is not None:
            # The container's process, not the `podman run` client: a client killed alone
            # leaves its container running (and it forwards a SIGTERM itself).
            containers.kill(self.image_name, sig)
            if sig != signal.SIGKILL:
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def finish(self) -> int:
        """The container ends with its main process: kill what is left of it, reap, exit code."""
        self.signal_group(signal.SIGKILL)
        self.process.wait()
        if self.image_name is not None:
            containers.remove(self.image_name)
        self.finished = True
        return exit_code(self.process.returncode)

    def main_pid(self) -> int:
        """The process a `kill` of the container's main process reaches."""
        if self.image_name is None:
            return self.process.pid
        pid = containers.main_pid(self.image_name)
        assert pid is not None, f"pod {self.pod}: its container {self.image_name} is not running"
        return pid


@dataclass
class Kubelet:
    plane: ControlPlane
    namespace: str  # the test's namespace: pods elsewhere belong to other tests
    node: str = NODE
    port_variables: PortVariables = field(default_factory=lambda: dict(SCALERL_PORTS))
    logs_dir: Path | None = None  # where pod logs stay (default: in the root, removed at exit)
    max_grace_s: float = MAX_GRACE_S
    # Pod name prefix -> seconds the start of the first such pod takes (an image pull on a fresh
    # node): it stays Pending that long after the kubelet first sees it.
    slow_starts: dict[str, float] = field(default_factory=dict)
    # A pod's image -> the local Podman image its container runs in; pods of other images run
    # as local processes (this machine stands in for their image).
    images: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A short root: vLLM puts Unix sockets (107 bytes at most) under a pod's directories.
        self.root = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
        self.logs_dir = self.logs_dir or self.root / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.marker = uuid.uuid4().hex
        self.network = Network()
        self.containers: dict[str, Container] = {}  # by pod uid
        self.ended: dict[str, int] = {}  # pod name -> exit code, of every container that ended
        self.ran_in: dict[str, str] = {}  # pod name -> local image, of every pod run in one
        self.waiting: dict[str, str] = {}  # pod uid -> why it is still Pending
        self.slow: dict[str, float] = {}  # pod uid -> when it may start (a slow start)
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    # --- for tests --------------------------------------------------------------------------------

    def claim_dir(self, claim: str) -> Path:
        """The directory behind a PersistentVolumeClaim of the namespace (made on first use)."""
        path = self.root / "pv" / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    def pid(self, pod: str) -> int:
        """The main process of a running pod (in a container: the container's)."""
        with self.lock:
            found = [c for c in self.containers.values() if c.pod == pod and not c.finished]
        assert found, f"pod {pod} has no running process"
        return found[0].main_pid()

    def in_image(self, pod: str) -> str | None:
        """The local image a pod's container ran in, or None for a local process."""
        return self.ran_in.get(pod)

    def running(self) -> list[str]:
        """The pods whose process is still running."""
        with self.lock:
            return sorted(c.pod for c in self.containers.values() if not c.finished)

    def log(self, pod: str) -> str:
        assert self.logs_dir is not None
        path = self.logs_dir / f"{pod}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_tail(self, lines: int = 25) -> str:
        """The end of every pod's log: what a failing test prints."""
        assert self.logs_dir is not None
        out = []
        for path in sorted(self.logs_dir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.stem} ---\n" + "\n".join(tail))
        return "\n".join(out)

    def leftovers(self) -> list[int]:
        """Processes still alive that one of our pods started (descendants included)."""
        needle = f"{MARKER}={self.marker}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue  # gone, or a zombie
            if needle in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def wait_for_leftovers(self, timeout_s: float = 10.0) -> list[str]:
        """What is left once killed processes had `timeout_s` to die: a process stays readable
        in /proc for a moment after SIGKILL, longer on a loaded machine. Described, for a report."""
        deadline = time.monotonic() + timeout_s
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [_describe(pid) for pid in left]

    # --- life cycle ------------------------------------------------------------------------------

    def __enter__(self) -> Kubelet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        left = self.wait_for_leftovers()
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)  # claims included: tests read them before
        assert not self.thread.is_alive(), "the kubelet did not stop"
        assert not left, f"processes left behind by pods: {left}"
        assert not self.errors, f"the kubelet failed: {self.errors!r}"

    def _kill_all(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after a short grace."""
        with self.lock:
            containers = list(self.containers.values())
        for c in containers:
            c.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for c in containers:
            while not c.finished and not c.main_ended() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not c.finished:
                c.finish()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self.sync()
                except Exception as err:  # keep going; the test sees it at exit
                    self.errors.append(err)
                self.stop.wait(TICK_S)
        finally:
            # On this thread: its end sends SIGKILL to every process it started (pdeathsig),
            # so the orderly SIGTERM must come first, from here.
            self._kill_all()

    # --- one pass ---------------------------------------------------------------------------------

    def sync(self) -> None:
        listed = self._get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        pods = {p["metadata"]["uid"]: p for p in listed if self._mine(p)}
        for uid, container in list(self.containers.items()):
            pod = pods.get(uid)
            if (pod is None or _deleting(pod)) and container.kill_at is None:
                self._terminate(container)
            self._reap(container, pod)
        for uid, pod in pods.items():
            if uid in self.containers:
                continue
            if _deleting(pod):
                self._delete_now(pod)  # nothing of it runs here: finish its deletion
            elif _phase(pod) == "Pending":
                self._start(pod)

    def _mine(self, pod: dict[str, Any]) -> bool:
        return pod["spec"].get("nodeName") in (None, self.node)

    def _terminate(self, container: Container) -> None:
        """The pod was deleted: SIGTERM now, SIGKILL after the grace period."""
        container.signal_group(signal.SIGTERM)
        container.kill_at = time.monotonic() + container.grace_s

    def _reap(self, container: Container, pod: dict[str, Any] | None) -> None:
        if container.kill_at is not None and time.monotonic() >= container.kill_at:
            container.signal_group(signal.SIGKILL)
        if not container.finished and container.main_ended():
            code = container.finish()
            self.ended[container.pod] = code
            if container.always and pod is not None and not _deleting(pod):
                if not self.stop.is_set():
                    self._restart(container, pod)
                return
            if pod is not None:
                written = containers.termination_log(self.root / "pods" / container.uid[:8])
                said = written.read_text(errors="replace") if written.exists() else ""
                said = said or _termination_message(pod, code, self.log(container.pod))
                self._write_status(pod, _terminated(pod, code, container.started, said))
        if container.finished and (pod is None or _deleting(pod)):
            if pod is not None:
                self._delete_now(pod)
            with self.lock:
                del self.containers[container.uid]

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        for prefix in [p for p in self.slow_starts if meta["name"].startswith(p)]:
            self.slow[meta["uid"]] = time.monotonic() + self.slow_starts.pop(prefix)
        if time.monotonic() < self.slow.get(meta["uid"], 0.0):
            return  # still "pulling its image"
        scratch = self.root / "pods" / meta["uid"][:8]
        bound = {**pod, "spec": {**pod["spec"], "nodeName": self.node}}
        image = self.images.get(pod["spec"]["containers"][0].get("image", ""))
        always = pod["spec"].get("restartPolicy", "Always") == "Always"
        if always:  # kubelet_plan plans one run of the container; this kubelet restarts it
            bound["spec"]["restartPolicy"] = "Never"
        try:
            with self.lock:
                # In an image, the container's environment is the pod's alone.
                cluster, env = self._cluster(), {} if image else self._base_env()
                plan = plan_pod(bound, cluster, self.network, scratch, env, self.port_variables)
            argv = self._argv(plan) if image is None else self._podman_argv(pod, plan, image)
        except NotReady as why:
            self._wait(pod, why.reason, str(why))
            return
        except Unsupported as err:
            if pod["metadata"]["uid"] not in self.waiting:
                self.errors.append(err)
            self._wait(pod, "Unsupported", str(err))
            return
        if self._ports_busy(plan):
            return  # a deleted pod's process still holds its ports; next pass
        if not pod["spec"].get("nodeName") and not self._bind(pod):
            return
        self._launch(pod, plan, argv, image, always)

    def _ports_busy(self, plan: ProcessPlan) -> bool:
        """Pods of a deleted gang may still be shutting down on the ports the new gang uses (in a
        cluster the new pods would have new IP addresses): wait until those processes are gone."""
        with self.lock:
            dying = [
                c for c in self.containers.values() if c.kill_at is not None and not c.finished
            ]
        return any(c.plan.ports & plan.ports for c in dying)

    def _bind(self, pod: dict[str, Any]) -> bool:
        """Schedule the pod here, as kube-scheduler would; False when it is gone meanwhile."""
        name = pod["metadata"]["name"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        code, body = self.plane.api("POST", f"{self._pod_path(pod)}/binding", binding)
        if code in (404, 409):  # deleted, or its deletion began: nothing to run
            return False
        if code != 201:
            raise AssertionError(f"binding pod {name}: {code} {body}")
        return True

    def _launch(
        self,
        pod: dict[str, Any],
        plan: ProcessPlan,
        argv: list[str],
        image: str | None,
        always: bool,
    ) -> None:
        meta = pod["metadata"]
        for path in plan.dirs:
            path.mkdir(parents=True, exist_ok=True)
        for path, text in plan.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        env = plan.env
        if image is not None:  # `podman run` itself runs with this machine's environment
            env = self._base_env()
            self.ran_in[meta["name"]] = image
            for path in plan.dirs:  # emptyDirs are world-writable (0777), as Kubernetes makes them
                path.chmod(0o777)
        env = {**env, MARKER: self.marker}
        process = self._spawn(meta["name"], argv, env, plan.cwd)
        grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        container = Container(
            meta["name"],
            meta["namespace"],
            meta["uid"],
            plan,
            process,
            min(float(grace), self.max_grace_s),
            started=_now(),
            image_name=containers.container_name(pod) if image is not None else None,
            always=always,
            argv=argv,
            env=env,
        )
        with self.lock:
            self.containers[meta["uid"]] = container
            self.waiting.pop(meta["uid"], None)
        self._write_status(pod, _running(pod, container.started))

    def _spawn(
        self, pod: str, argv: list[str], env: dict[str, str], cwd: Path
    ) -> subprocess.Popen[bytes]:
        assert self.logs_dir is not None
        with (self.logs_dir / f"{pod}.log").open("ab") as log:
            return subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as one, like a container
            )

    def _restart(self, container: Container, pod: dict[str, Any]) -> None:
        """restartPolicy Always: the same container again, in the same pod."""
        c = container
        c.process = self._spawn(c.pod, c.argv, c.env, c.plan.cwd)
        container.finished = False
        container.restarts += 1
        container.started = _now()
        self._write_status(pod, _running(pod, container.started, container.restarts))

    def _argv(self, plan: ProcessPlan) -> list[str]:
        executable = shutil.which(plan.argv[0], path=plan.env.get("PATH"))
        if executable is None:
            raise Unsupported(f"{plan.argv[0]!r} is not on the pod's PATH")
        argv = [executable, *plan.argv[1:]]
        # SIGKILL when the thread that started it dies: nothing outlives a killed test.
        return [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if SETPRIV else argv

    def _podman_argv(self, pod: dict[str, Any], plan: ProcessPlan, image: str) -> list[str]:
        scratch = self.root / "pods" / pod["metadata"]["uid"][:8]
        marker = {MARKER: self.marker}
        argv = containers.podman_run(
            pod, plan, image, scratch, self.claim_dir, self.plane.ca, marker
        )
        return [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if SETPRIV else argv

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(HOST_ONLY)}
        # This venv's console scripts (`scalerl`) stand in for the image's.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def _cluster(self) -> Cluster:
        ns = f"/api/v1/namespaces/{self.namespace}"

        def config_map(namespace: str, name: str) -> dict[str, Any] | None:
            return self._get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

        def secret(namespace: str, name: str) -> dict[str, Any] | None:
            return self._get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{name}")

        def claim(namespace: str, name: str) -> Path | None:
            path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"
            if self._get_or_none(path) is None:
                return None
            return self.claim_dir(name)

        services = self._get(f"{ns}/services")["items"]
        credentials = Credentials(self.plane.url, self.plane.ca, self._token)
        return Cluster(services, config_map, secret, claim, credentials)

    def _token(self, pod: dict[str, Any]) -> str:
        """A token of the pod's ServiceAccount, bound to the pod (so it dies with it), from the
        TokenRequest API: what the kubelet mounts at /var/run/secrets/kubernetes.io/."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": ["https://kubernetes.default.svc"],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token"
        code, body = self.plane.api("POST", path, request)
        if code == 404:
            raise NotReady("CreateContainerConfigError", f'serviceaccount "{account}" not found')
        if code != 201:
            raise AssertionError(f"token of {meta['namespace']}/{account}: {code} {body}")
        return str(body["status"]["token"])

    def _wait(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """Keep the pod Pending and say why (once per reason)."""
        uid = pod["metadata"]["uid"]
        if self.waiting.get(uid) == message:
            return
        self.waiting[uid] = message
        condition = {"type": "PodScheduled", "status": "False", "reason": reason}
        self._write_status(pod, {"conditions": [{**condition, "message": message}]})

    def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        code, body = self.plane.api_patch(f"{self._pod_path(pod)}/status", {"status": status})
        if code not in (200, 404):  # 404: deleted meanwhile, nothing to report to
            raise AssertionError(f"pod status of {pod['metadata']['name']}: {code} {body}")

    def _delete_now(self, pod: dict[str, Any]) -> None:
        """The kubelet's last word on a deleted pod: it is gone here, remove it now."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        options["preconditions"] = {"uid": pod["metadata"]["uid"]}
        code, body = self.plane.api("DELETE", self._pod_path(pod), options)
        if code not in (200, 404, 409):  # 409: a pod of the same name, made since
            raise AssertionError(f"deleting pod {pod['metadata']['name']}: {code} {body}")

    def _pod_path(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"

    def _get(self, path: str) -> dict[str, Any]:
        code, body = self.plane.api("GET", path)
        if code != 200:
            raise AssertionError(f"GET {path}: {code} {body}")
        return dict(body)

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        code, body = self.plane.api("GET", path)
        return dict(body) if code == 200 else None


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _describe(pid: int) -> str:
    """pid, process group, state and command line of a process (as far as it is still there)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state, _ppid, pgid = stat[stat.rindex(")") + 2 :].split()[:3]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except (OSError, ValueError):
        return f"{pid} (gone)"
    return f"{pid} pgid {pgid} state {state}: {argv}"


def _conditions(ready: bool) -> list[dict[str, str]]:
    value = "True" if ready else "False"
    return [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": value},
        {"type": "Ready", "status": value},
    ]


def _running(pod: dict[str, Any], started: str, restarts: int = 0) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    return {
        "phase": "Running",
        "hostIP": LOCALHOST,
        "podIP": LOCALHOST,
        "podIPs": [{"ip": LOCALHOST}],
        "startTime": started,
        "conditions": _conditions(ready=True),
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": restarts,
                "state": {"running": {"startedAt": started}},
            }
        ],
    }


# A kubelet's FallbackToLogsOnError keeps this much of a failed container's log as its message.
MESSAGE_LINES, MESSAGE_BYTES = 80, 2048


def _termination_message(pod: dict[str, Any], code: int, log: str) -> str:
    """The container's termination message where it wrote none (a Podman pod may write its
    terminationMessagePath; a local process has none), as a kubelet makes it from its log: the
    log's tail where the container failed and asked for it (`terminationMessagePolicy:
    FallbackToLogsOnError`), nothing otherwise."""
    policy = pod["spec"]["containers"][0].get("terminationMessagePolicy")
    if code == 0 or policy != "FallbackToLogsOnError":
        return ""
    tail = "\n".join(log.splitlines()[-MESSAGE_LINES:])
    return tail.encode()[-MESSAGE_BYTES:].decode(errors="replace")


def _terminated(pod: dict[str, Any], code: int, started: str, message: str = "") -> dict[str, Any]:
    """The pod's end as a kubelet reports it: phase, exit code, reason, message and times."""
    container = pod["spec"]["containers"][0]
    ended = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started,
        "finishedAt": _now(),
        **({"message": message} if message else {}),
    }
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": _conditions(ready=False),
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": ended},
            }
        ],
    }


@contextlib.contextmanager
def printing_logs_on_failure(kubelet: Kubelet) -> Iterator[None]:
    """Show the pods' logs when the block fails: the first thing one looks at."""
    try:
        yield
    except BaseException:
        print(kubelet.logs_tail())
        raise
