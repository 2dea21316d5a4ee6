"""The gang: a parsed ScaleRLRun -> the Jobs (or, for a queued run, the JobSet) of its trainer and
generator pods (plain dicts).

Workloads are Indexed Jobs, not StatefulSets: a process that exits must stay exited. A StatefulSet
restarts a failed container in place (restartPolicy Always), which would rejoin a weight-sync
group whose peers are mid-collective; an Indexed Job with `restartPolicy: Never` turns any
failure into a Failed pod. The trainers' Job has `backoffLimit: 0`: a trainer's failure fails
it, and the operator restarts the whole gang from the last checkpoint. A generator is replaced
alone (the trainer trains on without it and lets its replacement into the weight-sync group):
its Job retries each index on its own (`backoffLimitPerIndex`), a replacement only once the
failed pod is gone (`podReplacementPolicy: Failed`: never two processes of one index), and fails
as a whole, restarting the gang, only once an index used up its retries (`maxFailedIndexes: 0`).
The operator fails the gang sooner for a generator that fails again before the trainer trained
a step since its last replacement (`scalerl.operator.lifecycle.gang`). A trainer that reaches
its budget exits 0, so "Succeeded" means what it says. Each pod learns its index from the Job
(JOB_COMPLETION_INDEX); the rest of its process is fully described by the container command and
the environment contract of scalerl.environment.

A colocated run (`spec.placement: colocated`) is one process, `scalerl colocated`: the trainer with
its vLLM engine in process. It runs as the trainer's Job (one pod, trainer 0's environment, the
trainer's resources) and has no generator Job, so its gang is that one pod.

Storage convention: `spec.checkpoint.claimName` is one volume laid out as `models/`, `data/` and
`runs/<run>/`, mounted at /models and /data (read-only) and /checkpoints (the run directory), so a
spec names its model and data as /models/... and /data/... . Without a claim, checkpoints live in
an emptyDir and do not survive a gang restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.environment import OPENENV_URL_VAR, ProcessEnv
from scalerl.operator import codepods, names, sources
from scalerl.operator.envserver import env_server_url, runs_rollouts
from scalerl.operator.objects import (
    CHANNEL_PORT,
    CONFIG_DIR,
    CONTAINER_SECURITY,
    GPU,
    KEYS_DIR,
    METRICS_PORT,
    RANKS_PORT,
    RUN_DIR,
    SPEC_FILE,
    SYNC_PORT,
    Images,
    Owner,
    ports,
    tracking_environ,
)
from scalerl.rollout.keys import ALL_FILES, GENERATOR_FILES
from scalerl.spec import (
    CPU_PER_GPU,
    MEMORY_PER_GPU_GIB,
    QUEUE_LABEL,
    SHM_CPU_POD_GIB,
    SHM_PER_GPU_GIB,
    EnvironmentSpec,
    ReplicaSpec,
    ScaleRLRun,
)

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
_INDEX_VAR = "SCALERL_GENERATOR_INDEX"
_RANK_VAR = "SCALERL_TRAINER_RANK"
_LOCAL_RANK_VAR = "LOCAL_RANK"
# A generator index's retries before its Job fails (and the gang restarts): a backstop only; the
# operator fails the gang at a generator's first failure that follows no trained step.
GENERATOR_RETRIES = 100
# spec.environment.packages, installed at pod start into this emptyDir, on the process's PYTHONPATH.
ENV_PACKAGES_DIR = "/opt/scalerl/environment-packages"


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
    container: dict[str, Any] = {
        "name": role_name,
        "image": image,
        "command": process_command(run, role_name),
        "env": [
            {"name": k, "value": v}
            for k, v in sorted(process_environ(run, owner, role_name).items())
        ],
        "ports": [{"name": name, "containerPort": port} for name, port in ports()],
        "resources": _resources(replicas),
        "volumeMounts": mounts,
        "securityContext": CONTAINER_SECURITY,
    }
    if role_name == names.ROLE_TRAINER:
        tracking_environ(run, owner, container)
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
    if role_name == codepods.scoring_role(run)[0]:  # it runs model-written code
        pod_fields, container_security = codepods.code_pod_fields(run)
        pod_spec.update(pod_fields)
        container["securityContext"] = {**CONTAINER_SECURITY, **container_security}
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
            **_retries(role_name),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def _retries(role_name: str) -> dict[str, Any]:
    """How the role's Job retries a failed pod (the module's text): a generator is replaced
    alone; a trainer (a colocated run's one process too) fails the Job, and the gang restarts."""
    if role_name != names.ROLE_GENERATOR:
        return {"backoffLimit": 0}
    return {
        "backoffLimitPerIndex": GENERATOR_RETRIES,
        "maxFailedIndexes": 0,
        "podReplacementPolicy": "Failed",
    }


def _default_image(run: ScaleRLRun, role_name: str, images: Images) -> str:
    """The role's image unless its spec names one. A colocated process runs vLLM in process:
    the generator image has vLLM (and torch), the trainer image has no vLLM."""
    if role_name == names.ROLE_TRAINER and not run.spec.colocated:
        return images.trainer
    return images.generator


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
        inits.append(_packages_init(environment, image))
        volumes.append({"name": "environment-packages", "emptyDir": {}})
        mount = {"name": "environment-packages", "mountPath": ENV_PACKAGES_DIR, "readOnly": True}
        container["volumeMounts"] = [*container["volumeMounts"], mount]
        container["env"] = [*container["env"], {"name": "PYTHONPATH", "value": ENV_PACKAGES_DIR}]
    return {"initContainers": inits} if inits else {}


def _packages_init(environment: EnvironmentSpec, image: str) -> dict[str, Any]:
    """pip of the process's own image installs the environment's packages into the pod's
    folder. Without their dependencies: whatever the image holds (torch, vLLM, verifiers) is
    never shadowed by another version; a package's requirements the image lacks are listed too.
    A private index's URL (with its credentials) comes from its Secret as PIP_INDEX_URL, which
    pip reads: it is in no command (pip masks its password in what it prints)."""
    command = ["python3", "-m", "pip", "install", "--no-cache-dir", "--no-deps"]
    command += ["--disable-pip-version-check", "--target", ENV_PACKAGES_DIR]
    if environment.index_url is not None:  # never with credentials: the spec refuses them
        command += ["--index-url", environment.index_url]
    init: dict[str, Any] = {
        "name": "environment-packages",
        "image": image,
        "command": [*command, *environment.packages],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "environment-packages", "mountPath": ENV_PACKAGES_DIR}],
        "securityContext": CONTAINER_SECURITY,
    }
    secret = environment.index_secret
    if secret is not None:
        ref = {"name": secret.name, "key": secret.key}
        init["env"] = [{"name": "PIP_INDEX_URL", "valueFrom": {"secretKeyRef": ref}}]
    return init


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
