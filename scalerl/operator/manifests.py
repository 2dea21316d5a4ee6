"""Pure builders: a parsed ScaleRLRun -> the Kubernetes objects that run it (plain dicts).

Workloads are Indexed Jobs, not StatefulSets: a process that exits must stay exited. A StatefulSet
restarts a failed container in place (restartPolicy Always), which would rejoin a weight-sync
group whose peers are mid-collective; an Indexed Job with `restartPolicy: Never` and
`backoffLimit: 0` turns any failure into a Failed pod, and the operator restarts the whole gang
from the last checkpoint. A trainer that reaches its budget exits 0, so "Succeeded" means what it
says. Each pod learns its index from the Job (JOB_COMPLETION_INDEX); the rest of its process is
fully described by the container command and the environment contract of scalerl.environment.

A colocated run (`spec.placement: colocated`) is one process, `scalerl colocated`: the trainer with
its vLLM engine in process. It runs as the trainer's Job (one pod, trainer 0's environment, the
trainer's resources) and has no generator Job, so its gang is that one pod.

Storage convention: `spec.checkpoint.claimName` is one volume laid out as `models/`, `data/` and
`runs/<run>/`, mounted at /models and /data (read-only) and /checkpoints (the run directory), so a
spec names its model and data as /models/... and /data/... . Without a claim, checkpoints live in
an emptyDir and do not survive a gang restart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from scalerl.environment import OPENENV_URL_VAR, ProcessEnv
from scalerl.operator import names, sources
from scalerl.rollout.keys import ALL_FILES, GENERATOR_FILES, StreamKeys
from scalerl.spec import (
    API_VERSION,
    CPU_PER_GPU,
    KIND,
    MEMORY_PER_GPU_GIB,
    QUEUE_LABEL,
    SHM_CPU_POD_GIB,
    SHM_PER_GPU_GIB,
    OpenEnvEnvironment,
    ReplicaSpec,
    ScaleRLRun,
)
from scalerl.tracking.records import RUN_UID_ENV

IMAGE_TAG = "0.1.0"
CONFIG_DIR = "/etc/scalerl"
SPEC_FILE = "run.yaml"
RUN_DIR = "/checkpoints"
KEYS_DIR = "/etc/scalerl/stream-keys"
CHANNEL_PORT = 5555
SYNC_PORT = 29500
RANKS_PORT = 29400  # the trainer ranks' own process group
METRICS_PORT = 9400
FIT_TTL_S = 600  # finished fit Jobs expire; their result is in status.prediction
FIT_DEADLINE_S = 900
GPU = "nvidia.com/gpu"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
_INDEX_VAR = "SCALERL_GENERATOR_INDEX"
_RANK_VAR = "SCALERL_TRAINER_RANK"
_LOCAL_RANK_VAR = "LOCAL_RANK"
# spec.environment.packages, installed at pod start into this emptyDir, on the process's PYTHONPATH.
ENV_PACKAGES_DIR = "/opt/scalerl/environment-packages"


# Our images run as this user (see the Dockerfiles); the pods say so, so that Kubernetes can
# check runAsNonRoot and the mounted Secret and volumes are readable by the group.
RUN_AS = 10001
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True)
class Images:
    trainer: str = f"scalerl/trainer:{IMAGE_TAG}"
    generator: str = f"scalerl/generator:{IMAGE_TAG}"
    fit: str = f"scalerl/operator:{IMAGE_TAG}"  # the fit needs scipy, not torch
    # The hf:// downloads (scalerl.operator.initializer says why this image).
    initializer: str = f"scalerl/operator:{IMAGE_TAG}"
    pull_secrets: tuple[str, ...] = ()  # for a private registry (the chart's imagePullSecrets)
    # The user (and group, and fsGroup) the pods run as; None leaves all three to the platform
    # (OpenShift's restricted-v2 assigns them from the namespace's range and refuses fixed ones).
    run_as: int | None = RUN_AS

    def for_run(self, run: ScaleRLRun) -> Images:
        """These images with the run's own pod user where its spec.podSecurity names one."""
        security = run.spec.pod_security
        return self if security is None else replace(self, run_as=security.run_as_user)

    def pod_fields(self) -> dict[str, Any]:
        if not self.pull_secrets:
            return {}
        return {"imagePullSecrets": [{"name": name} for name in self.pull_secrets]}

    def pod_security(self) -> dict[str, Any]:
        """Restricted Pod Security for every pod the operator makes. With an fsGroup, volumes are
        chowned to it only where their root does not match already (a model volume is not walked
        at every gang start)."""
        restricted = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        if self.run_as is None:
            return restricted
        ids = {"runAsUser": self.run_as, "runAsGroup": self.run_as, "fsGroup": self.run_as}
        return {**restricted, **ids, "fsGroupChangePolicy": "OnRootMismatch"}


@dataclass(frozen=True)
class NetworkSettings:
    """The run's NetworkPolicy (the chart's `networkPolicy` values)."""

    enabled: bool = True
    # Namespaces (by name) whose pods may scrape the run's /metrics.
    metrics_namespaces: tuple[str, ...] = ("monitoring",)


@dataclass(frozen=True)
class Owner:
    """The run as the owner of its children."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, role: str, **extra_labels: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            # The run's identity labels last: nothing extra can change what selects a child.
            "labels": {**extra_labels, **names.labels(self.name, role)},
            "ownerReferences": [self.reference()],
        }


def children(
    run: ScaleRLRun,
    owner: Owner,
    attempt: int,
    images: Images,
    keys: StreamKeys,
    network: NetworkSettings = NetworkSettings(),
) -> list[dict[str, Any]]:
    """Everything a running run has, in creation order (the workloads last)."""
    return [
        *static_children(run, owner, attempt, keys, network, images),
        *workloads(run, owner, attempt, images),
    ]


def static_children(
    run: ScaleRLRun,
    owner: Owner,
    attempt: int,
    keys: StreamKeys,
    network: NetworkSettings = NetworkSettings(),
    images: Images = Images(),
) -> list[dict[str, Any]]:
    """Children that live as long as the run: config, stream keys, network policy, Service and
    the status RBAC (the Service selects gang `attempt`), and an OpenEnv server's Deployment and
    Service (spec.environment.openenv.image). The policy comes before any pod, so no pod is ever
    unprotected."""
    policy = [network_policy(owner, network)] if network.enabled else []
    return [
        config_map(run, owner),
        stream_keys_secret(owner, keys),
        *policy,
        service_account(owner),
        role(owner),
        role_binding(owner),
        service(owner, attempt),
        *env_server(run, owner, images),
    ]


def workloads(run: ScaleRLRun, owner: Owner, attempt: int, images: Images) -> list[dict[str, Any]]:
    """The gang of `attempt`: a Job per role, or for a queued run one JobSet holding them."""
    jobs = [workload(run, owner, role, attempt, images) for role in workload_roles(run)]
    return jobs if run.queue_name is None else [gang_jobset(owner, attempt, jobs, run.queue_name)]


def gang_jobset(
    owner: Owner, attempt: int, jobs: list[dict[str, Any]], queue: str
) -> dict[str, Any]:
    """The gang as one JobSet in Kueue `queue`: one Kueue workload with a pod set per role, so
    Kueue admits every pod's resources at once or none (two Jobs would be two workloads, and
    half a gang could hold its GPUs while the other half waits).

    Created suspended (Kueue's webhook would suspend it too): no Job makes a pod before Kueue
    admits the whole. The Jobs keep their labels and pod templates, so everything that watches a
    gang's Jobs and pods finds them as before; JobSet's own restarts are off (the operator
    restarts a gang from its checkpoint) and so are its DNS hostnames (the pods keep the run's
    Service as their subdomain)."""
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": owner.metadata(
            names.gang(owner.name),
            names.ROLE_GANG,
            **{names.LABEL_ATTEMPT: str(attempt), QUEUE_LABEL: queue},
        ),
        "spec": {
            "suspend": True,
            "network": {"enableDNSHostnames": False},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": job["metadata"]["labels"][names.LABEL_ROLE],
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": job["metadata"]["labels"]},
                        "spec": job["spec"],
                    },
                }
                for job in jobs
            ],
        },
    }


def workload_roles(run: ScaleRLRun) -> tuple[str, ...]:
    """The roles that have a Job: a colocated run's one process is its trainer's pod."""
    return (names.ROLE_TRAINER,) if run.spec.colocated else names.WORKLOAD_ROLES


def run_document(run: ScaleRLRun, namespace: str) -> dict[str, Any]:
    """The ScaleRLRun the processes read: the spec as parsed, every default filled in."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": run.name, "namespace": namespace},
        "spec": run.spec.model_dump(by_alias=True, mode="json"),
    }


def config_map(run: ScaleRLRun, owner: Owner) -> dict[str, Any]:
    text = yaml.safe_dump(run_document(run, owner.namespace), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.metadata(names.config(owner.name), "config"),
        "data": {SPEC_FILE: text},
    }


def stream_keys_secret(owner: Owner, keys: StreamKeys) -> dict[str, Any]:
    """The rollout stream's CURVE keys; every gang attempt mounts the same Secret.

    Made for every run, colocated ones too, though their pod mounts none (see `workload`): the
    static children stay one set whatever the placement, and an unused Secret costs nothing."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owner.metadata(names.stream_keys(owner.name), "keys"),
        "type": "Opaque",
        "stringData": keys.text(),
    }


def network_policy(owner: Owner, network: NetworkSettings) -> dict[str, Any]:
    """Only the run's own pods reach its pods (rollout stream, sync store, and the ephemeral
    ports gloo and NCCL open for the broadcast itself); /metrics also from the monitoring
    namespaces. Egress stays open: pods read models and data from wherever the user keeps them."""
    run_pods = {"matchLabels": {names.LABEL_RUN: owner.name}}
    monitoring = {
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": list(network.metrics_namespaces),
                }
            ]
        }
    }
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": run_pods}]}]
    if network.metrics_namespaces:
        ingress.append({"from": [monitoring], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owner.metadata(names.network_policy(owner.name), "network"),
        "spec": {"podSelector": run_pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def service_selector(owner: Owner, attempt: int) -> dict[str, str]:
    """Trainer 0 of gang `attempt`. The attempt matters: with publishNotReadyAddresses a
    terminating pod stays a ready endpoint, so without it the DNS name would still answer with
    the old gang's trainer 0 while a restarted gang meets."""
    return {
        names.LABEL_RUN: owner.name,
        names.LABEL_ROLE: names.ROLE_TRAINER,
        names.LABEL_JOB_INDEX: "0",
        names.LABEL_ATTEMPT: str(attempt),
    }


def service(owner: Owner, attempt: int) -> dict[str, Any]:
    """Headless: its DNS name resolves straight to trainer 0's pod of the current gang attempt,
    which binds the ports. One name for every attempt: the pods' SCALERL_TRAINER_HOST and
    subdomain never change; the operator moves the selector when it starts a new attempt."""
    selector = service_selector(owner, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(names.service(owner.name), names.ROLE_TRAINER),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            # Peers rendezvous before anything is "ready"; there is no readiness to wait for.
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in _ports()
            ],
        },
    }


def service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": owner.metadata(names.account(owner.name), "status"),
    }


def role(owner: Owner) -> dict[str, Any]:
    """The run's processes may read and patch this run's status, and nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": owner.metadata(names.account(owner.name), "status"),
        "rules": [
            {
                "apiGroups": [API_VERSION.split("/")[0]],
                "resources": ["scalerlruns/status"],
                "resourceNames": [owner.name],
                "verbs": ["get", "patch"],
            }
        ],
    }


def role_binding(owner: Owner) -> dict[str, Any]:
    account = names.account(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": owner.metadata(account, "status"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
    }


def process_environ(run: ScaleRLRun, owner: Owner, role_name: str) -> dict[str, str]:
    """The environment contract, as the local runner writes it, for one role's pods."""
    spec = run.spec
    env = ProcessEnv(
        spec=Path(CONFIG_DIR) / SPEC_FILE,
        run_dir=Path(RUN_DIR),
        trainer_host=f"{names.service(owner.name)}.{owner.namespace}.svc",
        channel_port=CHANNEL_PORT,
        sync_port=SYNC_PORT,
        metrics_port=METRICS_PORT,
        # GPU-hours; a CPU run counts process-hours like the local runner.
        compute_units=spec.cluster_compute_units,
        status=f"kubernetes:{owner.namespace}/{owner.name}",
        bind_host="0.0.0.0",  # peers reach the pod through its Service, not its hostname
        stream_keys=None if spec.colocated else Path(KEYS_DIR),  # no stream, no keys
        trainer_ranks=spec.trainers.replicas * spec.ranks_per_trainer,
        ranks_port=RANKS_PORT,
        peer_timeout_s=float(spec.failure_policy.peer_timeout_seconds),
        startup_timeout_s=float(spec.failure_policy.startup_timeout_seconds),
    )
    environ = env.to_environ()
    url = env_server_url(run, owner)
    if url is not None and runs_rollouts(run, role_name):
        environ[OPENENV_URL_VAR] = url
    # One template serves every pod of a role: each takes its index (a generator's index, a
    # trainer's rank) from its Indexed Job pod (JOB_COMPLETION_INDEX, see ProcessEnv), and a
    # rank's place in its pod from torchrun.
    del environ[_LOCAL_RANK_VAR]
    if role_name == names.ROLE_GENERATOR:
        del environ[_INDEX_VAR]
    else:
        del environ[_RANK_VAR]
    return environ


def process_command(run: ScaleRLRun, role_name: str) -> list[str]:
    """The container's command: the role's process, or in a trainer pod with several GPUs one
    rank per GPU, started and watched by torchrun (one failed rank stops the others, and the pod
    fails with it, which restarts the gang). A colocated run's one process: `scalerl colocated`
    (at most one GPU, so one rank, and no torchrun)."""
    if run.spec.colocated:
        return ["scalerl", "colocated"]
    ranks = run.spec.ranks_per_trainer
    if role_name != names.ROLE_TRAINER or ranks == 1:
        return ["scalerl", role_name]
    # --standalone: the pod's ranks meet through torchrun's own store on localhost; the run's
    # ranks meet at trainer 0 (SCALERL_RANKS_PORT), each numbered from its pod's index.
    return ["torchrun", "--standalone", f"--nproc-per-node={ranks}", "--no-python"] + [
        "scalerl",
        role_name,
    ]


def workload(
    run: ScaleRLRun, owner: Owner, role_name: str, attempt: int, images: Images
) -> dict[str, Any]:
    """The Indexed Job of one role (trainer or generator) for one gang attempt."""
    trainer = role_name == names.ROLE_TRAINER
    replicas: ReplicaSpec = run.spec.trainers if trainer else run.spec.generators
    extra = {names.LABEL_ATTEMPT: str(attempt)}
    pod_labels = {**extra, **names.labels(owner.name, role_name)}
    mounts, volumes = _mounts(run), _volumes(run, owner, replicas)
    # A colocated process has no rollout stream between pods: it holds no keys (its environment
    # names none), so it neither needs the Secret to start nor holds a secret it never uses.
    if not run.spec.colocated:
        mounts.append({"name": "stream-keys", "mountPath": KEYS_DIR, "readOnly": True})
        volumes.append(_keys_volume(owner, role_name))
    image = replicas.image or _default_image(run, role_name, images)
    container = {
        "name": role_name,
        "image": image,
        "command": process_command(run, role_name),
        "env": [
            {"name": k, "value": v}
            for k, v in sorted(process_environ(run, owner, role_name).items())
        ],
        "ports": [{"name": name, "containerPort": port} for name, port in _ports()],
        "resources": _resources(replicas),
        "volumeMounts": mounts,
        "securityContext": CONTAINER_SECURITY,
    }
    if role_name == names.ROLE_TRAINER:
        _tracking_environ(run, owner, container)
    if sources.uses_hub(run) and run.spec.checkpoint.claim_name is not None:
        # The spec the pods read names the initializer's files (scalerl.operator.sources).
        mounts.append(sources.gang_mount())
        hub_env = [{"name": k, "value": v} for k, v in sources.gang_environ().items()]
        container["env"] = [*container["env"], *hub_env]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": images.for_run(run).pod_security(),
        **images.pod_fields(),
        **replicas.scheduling.over(run.spec.scheduling).pod_fields(),
        "subdomain": names.service(owner.name),
        **_init_containers(run, role_name, image, container, volumes),
        "containers": [container],
        "volumes": volumes,
    }
    if role_name == names.ROLE_TRAINER:
        pod_spec["serviceAccountName"] = names.account(owner.name)
    else:
        pod_spec["automountServiceAccountToken"] = False  # generators never call the API
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": owner.metadata(names.workload(owner.name, role_name), role_name, **extra),
        "spec": {
            "completionMode": "Indexed",
            "completions": replicas.replicas,
            "parallelism": replicas.replicas,
            "backoffLimit": 0,  # the operator restarts the gang; a lone retry would desync it
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def fit_job(run: ScaleRLRun, owner: Owner, number: int, images: Images) -> dict[str, Any]:
    """The curve fit: reads status.evaluations, writes status.prediction, exits."""
    command = ["scalerl", "fit", "--run", owner.name, "--namespace", owner.namespace]
    container = {
        "name": names.ROLE_FIT,
        "image": images.fit,
        "command": command,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": CONTAINER_SECURITY,
    }
    _tracking_environ(run, owner, container)  # it logs each fit as the trainer logs its steps
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": owner.metadata(names.fit_job(owner.name, number), names.ROLE_FIT),
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": FIT_DEADLINE_S,
            "ttlSecondsAfterFinished": FIT_TTL_S,
            "template": {
                "metadata": {"labels": names.labels(owner.name, names.ROLE_FIT)},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": names.account(owner.name),
                    "containers": [container],
                    "securityContext": images.for_run(run).pod_security(),
                    **images.pod_fields(),
                },
            },
        },
    }


def _tracking_environ(run: ScaleRLRun, owner: Owner, container: dict[str, Any]) -> None:
    """A container that logs to spec.tracking's trackers: the run's uid (the tracker run's
    identity, the same in every attempt) and the Secret's keys as its environment (tokens)."""
    tracking = run.spec.tracking
    if tracking is None or not tracking.trackers:
        return
    container["env"] = [*container.get("env", []), {"name": RUN_UID_ENV, "value": owner.uid}]
    if tracking.secret_ref is not None:
        container["envFrom"] = [{"secretRef": {"name": tracking.secret_ref.name}}]


def _default_image(run: ScaleRLRun, role_name: str, images: Images) -> str:
    """The role's image unless its spec names one. A colocated process runs vLLM in process:
    the generator image has vLLM (and torch), the trainer image has no vLLM."""
    if role_name == names.ROLE_TRAINER and not run.spec.colocated:
        return images.trainer
    return images.generator


def _ports() -> list[tuple[str, int]]:
    return [
        ("channel", CHANNEL_PORT),
        ("sync", SYNC_PORT),
        ("ranks", RANKS_PORT),
        ("metrics", METRICS_PORT),
    ]


def _resources(replicas: ReplicaSpec) -> dict[str, Any]:
    """The user's resources, with `gpus` as the GPU request (it is also the compute count); a GPU
    pod requests CPU_PER_GPU CPUs and MEMORY_PER_GPU_GIB of memory per GPU where they say
    nothing of either (as a request or a limit: a limit alone is also the request)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in replicas.resources.items()}
    for kind in ("requests", "limits"):
        out.setdefault(kind, {}).pop(GPU, None)
        if replicas.gpus:
            out[kind][GPU] = replicas.gpus  # extended resources: requests == limits
    if replicas.gpus:
        said = {*out["requests"], *out["limits"]}
        defaults = {
            "cpu": str(CPU_PER_GPU * replicas.gpus),
            "memory": f"{MEMORY_PER_GPU_GIB * replicas.gpus}Gi",
        }
        out["requests"].update({k: v for k, v in defaults.items() if k not in said})
    return {kind: value for kind, value in out.items() if value}


def _mounts(run: ScaleRLRun) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},  # NCCL and vLLM need more than 64 MiB
    ]
    if run.spec.checkpoint.claim_name is None:
        return [*mounts, {"name": "checkpoints", "mountPath": RUN_DIR}]
    return [
        *mounts,
        {"name": "store", "mountPath": "/models", "subPath": "models", "readOnly": True},
        {"name": "store", "mountPath": "/data", "subPath": "data", "readOnly": True},
        {"name": "store", "mountPath": RUN_DIR, "subPath": f"runs/{run.name}"},
    ]


def _init_containers(
    run: ScaleRLRun,
    role_name: str,
    image: str,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    """The pod's init containers: the run directory's, and spec.environment.packages' (which
    also puts their folder on `container`'s PYTHONPATH and adds its volume)."""
    inits = _run_directory_init(run, image).get("initContainers", [])
    environment = run.spec.environment
    if environment is not None and environment.packages and runs_rollouts(run, role_name):
        inits.append(_packages_init(environment.packages, environment.index_url, image))
        volumes.append({"name": "environment-packages", "emptyDir": {}})
        mount = {"name": "environment-packages", "mountPath": ENV_PACKAGES_DIR, "readOnly": True}
        container["volumeMounts"] = [*container["volumeMounts"], mount]
        container["env"] = [*container["env"], {"name": "PYTHONPATH", "value": ENV_PACKAGES_DIR}]
    return {"initContainers": inits} if inits else {}


def _packages_init(packages: list[str], index_url: str | None, image: str) -> dict[str, Any]:
    """pip of the process's own image installs the environment's packages into the pod's
    folder. Without their dependencies: whatever the image holds (torch, vLLM, verifiers) is
    never shadowed by another version; a package's requirements the image lacks are listed too."""
    command = ["python3", "-m", "pip", "install", "--no-cache-dir", "--no-deps"]
    command += ["--disable-pip-version-check", "--target", ENV_PACKAGES_DIR]
    if index_url is not None:
        command += ["--index-url", index_url]
    return {
        "name": "environment-packages",
        "image": image,
        "command": [*command, *packages],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "environment-packages", "mountPath": ENV_PACKAGES_DIR}],
        "securityContext": CONTAINER_SECURITY,
    }


def runs_rollouts(run: ScaleRLRun, role_name: str) -> bool:
    """Whether `role_name`'s pods run the environment: the generators, or a colocated run's one
    process."""
    return role_name == names.ROLE_GENERATOR or (
        run.spec.colocated and role_name == names.ROLE_TRAINER
    )


def _server_image(run: ScaleRLRun) -> OpenEnvEnvironment | None:
    """spec.environment.openenv where the operator runs its server (an image, no url)."""
    environment = run.spec.environment
    openenv = None if environment is None else environment.openenv
    if openenv is None or openenv.image is None or openenv.url is not None:
        return None
    return openenv


def env_server_url(run: ScaleRLRun, owner: Owner) -> str | None:
    """The run's OpenEnv server as its rollouts reach it: the `<run>-env` Service."""
    openenv = _server_image(run)
    if openenv is None:
        return None
    return f"http://{names.env_server(owner.name)}.{owner.namespace}.svc:{openenv.port}"


def env_server(run: ScaleRLRun, owner: Owner, images: Images) -> list[dict[str, Any]]:
    """spec.environment.openenv.image's server: a Deployment of `replicas` pods, ready when its
    /health answers (openenv-core's), and a Service before them (each WebSocket session stays
    on the pod it reached). Its pods carry the run's label, so the run's NetworkPolicy lets the
    run's pods, and only them, reach it. A suspended run keeps the Service, not the pods."""
    openenv = _server_image(run)
    if openenv is None:
        return []
    name = names.env_server(owner.name)
    selector = {names.LABEL_RUN: owner.name, names.LABEL_ROLE: names.ROLE_ENV}
    probe = {"httpGet": {"path": "/health", "port": openenv.port}, "periodSeconds": 5}
    container = {
        "name": "server",
        "image": openenv.image,
        "ports": [{"name": "http", "containerPort": openenv.port, "protocol": "TCP"}],
        "readinessProbe": probe,
        "securityContext": CONTAINER_SECURITY,
    }
    pod_spec = {
        "securityContext": images.for_run(run).pod_security(),
        **images.pod_fields(),
        "automountServiceAccountToken": False,  # the server never calls the API
        "containers": [container],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(name, names.ROLE_ENV),
        "spec": {
            "replicas": openenv.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": names.labels(owner.name, names.ROLE_ENV)},
                "spec": pod_spec,
            },
        },
    }
    port = {"name": "http", "port": openenv.port, "targetPort": openenv.port, "protocol": "TCP"}
    server = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(name, names.ROLE_ENV),
        "spec": {"selector": selector, "ports": [port]},
    }
    return [server] if run.spec.suspend else [server, deployment]


def _run_directory_init(run: ScaleRLRun, image: str) -> dict[str, Any]:
    """With `checkpoint.createRunDirectory`, an init container that makes runs/<run> on the claim
    as the pod's own user before the kubelet mounts it as a subPath (which would make a missing
    one owned by root); every pod that mounts it, since any may start first."""
    checkpoint = run.spec.checkpoint
    if checkpoint.claim_name is None or not checkpoint.create_run_directory:
        return {}
    init = {
        "name": "run-directory",
        "image": image,
        "command": ["mkdir", "-p", f"/store/runs/{run.name}"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "volumeMounts": [{"name": "store", "mountPath": "/store"}],
        "securityContext": CONTAINER_SECURITY,
    }
    return {"initContainers": [init]}


def _keys_volume(owner: Owner, role_name: str) -> dict[str, Any]:
    """Each role mounts only the keys it uses: a generator never holds the server secret. A
    trainer holds both pairs: it serves the stream and the stores, and its ranks other than 0
    meet rank 0's store as clients."""
    files = ALL_FILES if role_name == names.ROLE_TRAINER else GENERATOR_FILES
    return {
        "name": "stream-keys",
        "secret": {
            "secretName": names.stream_keys(owner.name),
            "defaultMode": 0o440,  # owner root, group fsGroup: readable by our user alone
            "items": [{"key": name, "path": name} for name in files],
        },
    }


def _volumes(run: ScaleRLRun, owner: Owner, replicas: ReplicaSpec) -> list[dict[str, Any]]:
    # /dev/shm is memory: bounded, so a runaway writer is evicted rather than starving the node.
    shm_gib = SHM_PER_GPU_GIB * replicas.gpus if replicas.gpus else SHM_CPU_POD_GIB
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.config(owner.name)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
    ]
    claim = run.spec.checkpoint.claim_name
    if claim is None:
        return [*volumes, {"name": "checkpoints", "emptyDir": {}}]
    return [*volumes, {"name": "store", "persistentVolumeClaim": {"claimName": claim}}]
