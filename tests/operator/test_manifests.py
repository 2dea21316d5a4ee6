"""The manifest builders, on their output: names, labels, owners, the environment contract."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.environment import ProcessEnv
from scalerl.errors import InputError, SpecError
from scalerl.operator import gang, manifests, names
from scalerl.operator.handlers import images_from_environ
from scalerl.operator.manifests import Images, NetworkSettings, Owner
from scalerl.rollout.keys import ALL_FILES, GENERATOR_FILES, SERVER_SECRET, StreamKeys
from scalerl.spec import ScaleRLRun, load_run, parse_run

ROOT = Path(__file__).resolve().parents[2]
RUN = load_run(ROOT / "examples" / "run.yaml")
OWNER = Owner(RUN.name, "research", "uid-1")
IMAGES = Images()
KEYS = StreamKeys.generate()


def children() -> list[dict[str, Any]]:
    return manifests.children(RUN, OWNER, 0, IMAGES, KEYS)


def by_kind(kind: str, role: str | None = None) -> dict[str, Any]:
    return next(
        c
        for c in children()
        if c["kind"] == kind and (role is None or c["metadata"]["labels"][names.LABEL_ROLE] == role)
    )


def container(role: str) -> dict[str, Any]:
    return by_kind("Job", role)["spec"]["template"]["spec"]["containers"][0]


def env_of(role: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(role)["env"]}


def test_children_have_deterministic_names() -> None:
    assert [(c["kind"], c["metadata"]["name"]) for c in children()] == [
        ("ConfigMap", "math-8b-config"),
        ("Secret", "math-8b-stream-keys"),
        ("NetworkPolicy", "math-8b-network"),
        ("NetworkPolicy", "math-8b-egress-trainer"),
        ("NetworkPolicy", "math-8b-egress-fit"),
        ("ServiceAccount", "math-8b-status"),
        ("Role", "math-8b-status"),
        ("RoleBinding", "math-8b-status"),
        ("Service", "math-8b-trainer"),
        ("Job", "math-8b-trainer"),
        ("Job", "math-8b-generator"),
    ]
    assert manifests.fit_job(RUN, OWNER, 3, IMAGES)["metadata"]["name"] == "math-8b-fit-3"


def test_every_child_is_owned_by_the_run_and_labelled() -> None:
    for child in [*children(), manifests.fit_job(RUN, OWNER, 1, IMAGES)]:
        meta = child["metadata"]
        assert meta["namespace"] == "research"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "scalerl.dev/v1alpha1",
                "kind": "ScaleRLRun",
                "name": "math-8b",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][names.LABEL_RUN] == "math-8b"
        assert meta["labels"][names.LABEL_ROLE]


def test_the_config_map_holds_the_parsed_spec_with_defaults() -> None:
    text = by_kind("ConfigMap")["data"]["run.yaml"]
    reparsed = parse_run(yaml.safe_load(text))
    assert reparsed.spec == RUN.spec
    assert yaml.safe_load(text)["spec"]["recipe"]["loss"] == {"type": "cispo", "epsilonMax": 4.0}


def test_the_headless_service_selects_trainer_zero_on_every_port() -> None:
    service = by_kind("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {
        names.LABEL_RUN: "math-8b",
        names.LABEL_ROLE: "trainer",
        names.LABEL_JOB_INDEX: "0",
        names.LABEL_ATTEMPT: "0",
    }
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"channel": 5555, "sync": 29500, "ranks": 29400, "metrics": 9400}


def trainer_zero(attempt: int) -> dict[str, str]:
    """The labels of trainer 0's pod of gang `attempt` (the Job controller adds the index)."""
    job = manifests.workload(RUN, OWNER, names.ROLE_TRAINER, attempt, IMAGES)
    return {**job["spec"]["template"]["metadata"]["labels"], names.LABEL_JOB_INDEX: "0"}


def test_the_service_selects_trainer_zero_of_its_gang_attempt_only() -> None:
    selector = manifests.service(OWNER, 2)["spec"]["selector"]
    assert selector.items() <= trainer_zero(2).items()
    assert not selector.items() <= trainer_zero(1).items()  # the gang being replaced
    # One Service name for every attempt: what each attempt's pods connect to never changes.
    hosts = {
        env["value"]
        for attempt in (1, 2)
        for job in manifests.workloads(RUN, OWNER, attempt, IMAGES)
        for env in job["spec"]["template"]["spec"]["containers"][0]["env"]
        if env["name"] == "SCALERL_TRAINER_HOST"
    }
    assert hosts == {f"{manifests.service(OWNER, 2)['metadata']['name']}.research.svc"}


def test_workloads_are_indexed_jobs_a_generator_retried_alone_a_trainer_never() -> None:
    trainers, generators = by_kind("Job", "trainer")["spec"], by_kind("Job", "generator")["spec"]
    assert trainers["backoffLimit"] == 0  # a trainer's failure fails its Job: the gang restarts
    assert "backoffLimitPerIndex" not in trainers
    # A generator's pod is replaced alone, once it is gone; its Job fails at an index's limit.
    assert "backoffLimit" not in generators
    assert generators["backoffLimitPerIndex"] == gang.GENERATOR_RETRIES
    assert generators["maxFailedIndexes"] == 0
    assert generators["podReplacementPolicy"] == "Failed"
    for role, replicas in (("trainer", 2), ("generator", 8)):
        spec = by_kind("Job", role)["spec"]
        assert spec["completionMode"] == "Indexed"
        assert spec["completions"] == spec["parallelism"] == replicas
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["template"]["metadata"]["labels"][names.LABEL_ATTEMPT] == "0"
        assert container(role)["command"][-2:] == ["scalerl", role]


def test_gpus_are_requested_per_replica() -> None:
    for role in ("trainer", "generator"):
        resources = container(role)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 8
        assert resources["requests"]["nvidia.com/gpu"] == 8


def test_user_resources_are_kept_and_gpus_come_from_the_gpus_field() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["generators"]["resources"] = {
        "requests": {"cpu": "16", "nvidia.com/gpu": 1},
        "limits": {"memory": "200Gi"},
    }
    run = parse_run(raw)
    job = manifests.workload(run, OWNER, "generator", 0, IMAGES)
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "16", "nvidia.com/gpu": 8},
        "limits": {"memory": "200Gi", "nvidia.com/gpu": 8},
    }


def test_cpu_runs_request_no_gpus_and_count_processes_as_compute() -> None:
    run = load_run(ROOT / "examples" / "local.yaml")
    job = manifests.workload(run, Owner("demo", "default", "u"), "trainer", 0, IMAGES)
    pod = job["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in str(pod["containers"][0]["resources"])
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["SCALERL_COMPUTE_UNITS"] == "3"  # 1 trainer + 2 generators, like the local runner


def test_pods_carry_the_local_runners_environment_contract() -> None:
    trainer = ProcessEnv.from_environ(env_of("trainer"))
    assert trainer.trainer_host == "math-8b-trainer.research.svc"
    assert trainer.spec == Path("/etc/scalerl/run.yaml")
    assert trainer.run_dir == Path("/checkpoints")
    assert trainer.compute_units == 8 * 8 + 2 * 8
    assert trainer.status == "kubernetes:research/math-8b"
    assert trainer.generator_index == -1
    generator_env = env_of("generator")
    assert "SCALERL_GENERATOR_INDEX" not in generator_env  # one template for every index
    generator = ProcessEnv.from_environ({**generator_env, "JOB_COMPLETION_INDEX": "5"})
    assert generator.generator_index == 5
    assert {**trainer.to_environ(), "SCALERL_GENERATOR_INDEX": "5"} == generator.to_environ()


def test_pods_meet_their_peers_within_the_runs_startup_timeout() -> None:
    # Pods may start minutes apart on a cluster: the first meeting waits as long as the operator
    # lets the gang start; later silences are the peer timeout's.
    trainer = ProcessEnv.from_environ(env_of("trainer"))
    assert trainer.startup_timeout_s == RUN.spec.failure_policy.startup_timeout_seconds == 1800
    assert trainer.peer_timeout_s == 300
    local = ProcessEnv.from_environ(
        {"SCALERL_SPEC": "s", "SCALERL_RUN_DIR": "r", "SCALERL_PEER_TIMEOUT": "120"} | PORTS
    )
    assert local.startup_timeout_s == local.peer_timeout_s == 120


def test_pods_listen_on_every_interface_and_local_processes_on_loopback_only() -> None:
    # In a pod, peers arrive through the Service; on one machine nothing else may connect.
    assert {env_of(role)["SCALERL_BIND_HOST"] for role in ("trainer", "generator")} == {"0.0.0.0"}
    local = ProcessEnv.from_environ({"SCALERL_SPEC": "s", "SCALERL_RUN_DIR": "r"} | PORTS)
    assert local.bind_host == "127.0.0.1"


PORTS = {"SCALERL_CHANNEL_PORT": "1", "SCALERL_SYNC_PORT": "2"}


def test_each_trainer_rank_is_numbered_from_its_pod_index_and_its_gpu() -> None:
    trainer_env = env_of("trainer")
    replicas, gpus = RUN.spec.trainers.replicas, RUN.spec.trainers.gpus
    assert "SCALERL_TRAINER_RANK" not in trainer_env  # one template for every rank
    assert "LOCAL_RANK" not in trainer_env  # torchrun numbers the ranks within a pod
    assert trainer_env["SCALERL_TRAINER_RANKS"] == str(replicas * gpus)
    assert trainer_env["SCALERL_RANKS_PORT"] == str(manifests.RANKS_PORT)
    ranks = [
        ProcessEnv.from_environ(
            {**trainer_env, "JOB_COMPLETION_INDEX": str(pod)}
            | {"LOCAL_RANK": str(gpu), "LOCAL_WORLD_SIZE": str(gpus)}
        )
        for pod in range(replicas)
        for gpu in range(gpus)
    ]
    assert [r.trainer_rank for r in ranks] == list(range(replicas * gpus))
    assert [r.trainer_local_rank for r in ranks] == list(range(gpus)) * replicas
    # A pod has one metrics port: its first rank serves it.
    assert [r.metrics_port for r in ranks[:gpus]] == [manifests.METRICS_PORT] + [0] * (gpus - 1)
    # A generator is no trainer rank, whatever its own Job index.
    generator = {**env_of("generator"), "JOB_COMPLETION_INDEX": "3"}
    assert ProcessEnv.from_environ(generator).trainer_rank == 0


@pytest.mark.parametrize(("gpus", "ranks_per_pod"), [(0, 1), (1, 1), (2, 2), (8, 8)])
def test_a_trainer_pod_runs_one_rank_per_gpu_under_torchrun(gpus: int, ranks_per_pod: int) -> None:
    run = with_trainers(gpus=gpus)
    trainer = manifests.workload(run, OWNER, "trainer", 0, IMAGES)
    (box,) = trainer["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in box["env"]}
    assert env["SCALERL_TRAINER_RANKS"] == str(run.spec.trainers.replicas * ranks_per_pod)
    if ranks_per_pod == 1:
        assert box["command"] == ["scalerl", "trainer"]
    else:
        assert box["command"][0] == "torchrun"
        assert f"--nproc-per-node={ranks_per_pod}" in box["command"]
        assert box["command"][-3:] == ["--no-python", "scalerl", "trainer"]
    generator = manifests.workload(run, OWNER, "generator", 0, IMAGES)
    assert generator["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "scalerl",
        "generator",
    ]


def with_trainers(**changes: Any) -> ScaleRLRun:
    """examples/run.yaml with its trainers changed."""
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["trainers"].update(changes)
    return parse_run(raw)


def test_an_explicit_generator_index_wins_over_the_job_index() -> None:
    environ = {**env_of("trainer"), "JOB_COMPLETION_INDEX": "1"}
    assert ProcessEnv.from_environ(environ).generator_index == -1


def test_the_checkpoint_claim_holds_models_data_and_the_run_directory() -> None:
    pod = by_kind("Job", "trainer")["spec"]["template"]["spec"]
    claim = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"] == {"claimName": "rl-ckpt"}
    mounts = {m["mountPath"]: m for m in container("trainer")["volumeMounts"]}
    assert mounts["/checkpoints"]["subPath"] == "runs/math-8b"
    assert mounts["/models"]["readOnly"] and mounts["/data"]["readOnly"]
    assert mounts["/etc/scalerl"]["name"] == "config"


def test_without_a_claim_checkpoints_live_in_an_empty_dir() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    del raw["spec"]["checkpoint"]["claimName"]
    job = manifests.workload(parse_run(raw), OWNER, "trainer", 0, IMAGES)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}


def test_only_the_trainer_may_call_the_api() -> None:
    trainer = by_kind("Job", "trainer")["spec"]["template"]["spec"]
    generator = by_kind("Job", "generator")["spec"]["template"]["spec"]
    assert trainer["serviceAccountName"] == "math-8b-status"
    assert generator["automountServiceAccountToken"] is False


def test_the_role_allows_only_get_and_patch_of_this_runs_status() -> None:
    assert by_kind("Role")["rules"] == [
        {
            "apiGroups": ["scalerl.dev"],
            "resources": ["scalerlruns/status"],
            "resourceNames": ["math-8b"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = by_kind("RoleBinding")
    assert binding["roleRef"]["name"] == "math-8b-status"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "math-8b-status", "namespace": "research"}
    ]


def test_the_fit_job_runs_the_fit_command_and_expires() -> None:
    job = manifests.fit_job(RUN, OWNER, 1, IMAGES)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == [
        "scalerl", "fit", "--run", "math-8b", "--namespace", "research",
    ]  # fmt: skip
    assert pod["serviceAccountName"] == "math-8b-status"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert pod["restartPolicy"] == "Never"


def test_a_replicas_image_overrides_the_default() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["trainers"]["image"] = "registry.local/trainer:dev"
    job = manifests.workload(parse_run(raw), OWNER, "trainer", 0, IMAGES)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/trainer:dev"


def test_builders_are_pure() -> None:
    assert children() == children()
    before = copy.deepcopy(RUN.model_dump())
    children()
    assert RUN.model_dump() == before


@pytest.mark.parametrize("name", ["7up", "x" * 48, "Upper"])
def test_names_children_cannot_carry_are_problems(name: str) -> None:
    assert names.name_problems(name)


def test_the_longest_allowed_name_fits_every_child() -> None:
    name = "r" * names.MAX_RUN_NAME
    assert names.name_problems(name) == []
    assert len(f"{names.workload(name, 'generator')}-9999") <= 63


def test_every_manifest_validates_against_kubernetes_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="not installed")
    for obj in [*children(), manifests.fit_job(RUN, OWNER, 1, IMAGES)]:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_each_role_mounts_only_the_stream_keys_it_uses() -> None:
    # A trainer serves the stream and the stores, and its ranks other than 0 are clients of
    # rank 0's store; a generator is a client only and never holds the server's secret.
    secret = by_kind("Secret")
    assert secret["stringData"] == KEYS.text()
    assert SERVER_SECRET not in GENERATOR_FILES
    for role, files in (
        (names.ROLE_TRAINER, ALL_FILES),
        (names.ROLE_GENERATOR, GENERATOR_FILES),
    ):
        spec = by_kind("Job", role)["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "stream-keys")
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        assert [item["key"] for item in volume["secret"]["items"]] == list(files)
        mount = next(m for m in container(role)["volumeMounts"] if m["name"] == "stream-keys")
        assert env_of(role)["SCALERL_STREAM_KEYS"] == mount["mountPath"]


def test_the_network_policy_admits_the_runs_pods_and_monitoring_to_metrics() -> None:
    policy = by_kind("NetworkPolicy")["spec"]
    run_pods = {"matchLabels": {names.LABEL_RUN: "math-8b"}}
    assert policy["podSelector"] == run_pods
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    own, monitoring = policy["ingress"]
    assert own == {"from": [{"podSelector": run_pods}]}
    selector = monitoring["from"][0]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == ["monitoring"]
    assert monitoring["ports"] == [{"protocol": "TCP", "port": manifests.METRICS_PORT}]


def test_the_network_policy_can_be_turned_off() -> None:
    off = manifests.children(RUN, OWNER, 0, IMAGES, KEYS, NetworkSettings(enabled=False))
    assert "NetworkPolicy" not in {obj["kind"] for obj in off}


def test_every_pod_runs_as_our_non_root_user_with_restricted_security() -> None:
    fit = manifests.fit_job(RUN, OWNER, 1, IMAGES)["spec"]["template"]["spec"]
    for spec in [
        *(by_kind("Job", r)["spec"]["template"]["spec"] for r in names.WORKLOAD_ROLES),
        fit,
    ]:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["fsGroup"] == manifests.RUN_AS  # the keys are readable
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        security = spec["containers"][0]["securityContext"]
        assert security == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_pods_pull_with_the_operators_pull_secrets() -> None:
    private = Images(pull_secrets=("registry",))
    objs = manifests.children(RUN, OWNER, 0, private, KEYS)
    jobs = [o for o in objs if o["kind"] == "Job"] + [manifests.fit_job(RUN, OWNER, 1, private)]
    for job in jobs:
        assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert "imagePullSecrets" not in by_kind("Job", "trainer")["spec"]["template"]["spec"]


def colocated(gpus: int = 0, **trainers: Any) -> ScaleRLRun:
    """examples/run.yaml as one colocated process, on CPU (gpus 0) or one GPU."""
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["placement"] = "colocated"
    raw["spec"]["generators"].update(replicas=1, gpus=gpus)
    raw["spec"]["trainers"].update(replicas=1, gpus=gpus, **trainers)
    return parse_run(raw)


def colocated_pod(run: ScaleRLRun, images: Images = IMAGES) -> dict[str, Any]:
    (job,) = manifests.workloads(run, OWNER, 0, images)
    return dict(job["spec"]["template"]["spec"])


def test_a_colocated_run_is_one_trainer_job_running_scalerl_colocated() -> None:
    objs = manifests.children(colocated(), OWNER, 0, IMAGES, KEYS)
    jobs = [o for o in objs if o["kind"] == "Job"]
    assert [(j["metadata"]["name"], j["metadata"]["labels"][names.LABEL_ROLE]) for j in jobs] == [
        ("math-8b-trainer", "trainer")
    ]
    spec = jobs[0]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 1
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["containers"][0]["command"] == ["scalerl", "colocated"]
    assert pod["serviceAccountName"] == "math-8b-status"  # it writes the run's status
    assert manifests.workload_roles(colocated()) == ("trainer",)


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_colocated_pod_has_trainer_zeros_environment(gpus: int) -> None:
    env = {e["name"]: e["value"] for e in colocated_pod(colocated(gpus))["containers"][0]["env"]}
    # One process on CPU, one GPU on a GPU: either way one compute unit.
    assert env["SCALERL_COMPUTE_UNITS"] == "1"
    assert env["SCALERL_TRAINER_RANKS"] == "1"
    process = ProcessEnv.from_environ({**env, "JOB_COMPLETION_INDEX": "0"})
    assert (process.trainer_rank, process.generator_index) == (0, -1)
    assert process.trainer_host == "math-8b-trainer.research.svc"
    assert process.metrics_port == manifests.METRICS_PORT
    assert process.status == "kubernetes:research/math-8b"


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_colocated_pod_takes_the_trainers_resources(gpus: int) -> None:
    resources = colocated_pod(colocated(gpus))["containers"][0]["resources"]
    assert resources["requests"]["memory"] == "512Gi"  # spec.trainers.resources
    if gpus:
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1
    else:
        assert "nvidia.com/gpu" not in str(resources)


def test_a_colocated_pod_runs_the_generator_image_unless_the_trainers_name_one() -> None:
    images = Images(trainer="registry.local/trainer:1", generator="registry.local/generator:1")
    default = colocated_pod(colocated(), images)["containers"][0]
    assert default["image"] == "registry.local/generator:1"  # vLLM is in the generator image
    own = colocated_pod(colocated(image="registry.local/mine:2"), images)["containers"][0]
    assert own["image"] == "registry.local/mine:2"


def test_a_colocated_pod_holds_no_stream_keys() -> None:
    objs = manifests.children(colocated(), OWNER, 0, IMAGES, KEYS)
    assert "Secret" in {o["kind"] for o in objs}  # the static children are one set
    pod = colocated_pod(colocated())
    assert "stream-keys" not in {v["name"] for v in pod["volumes"]}
    assert "stream-keys" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert ProcessEnv.from_environ(env).stream_keys is None


def test_a_gpu_pod_requests_cpu_and_memory_per_gpu_where_its_resources_are_silent() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    for role in ("trainers", "generators"):
        del raw["spec"][role]["resources"]  # 8 GPUs a pod: 4 CPUs and 32 GiB per GPU
    run = parse_run(raw)
    for role in ("trainer", "generator"):
        pod = manifests.workload(run, OWNER, role, 0, IMAGES)["spec"]["template"]["spec"]
        requests = pod["containers"][0]["resources"]["requests"]
        assert (requests["cpu"], requests["memory"]) == ("32", "256Gi")
        shm = next(v for v in pod["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["sizeLimit"] == "64Gi"


def test_a_role_s_scheduling_replaces_the_run_s_field_by_field() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    pool = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    raw["spec"]["scheduling"] = {"tolerations": [pool], "nodeSelector": {"pool": "gpu"}}
    raw["spec"]["generators"]["scheduling"] = {"tolerations": [], "schedulerName": "volcano"}
    run = parse_run(raw)
    pod = {
        role: manifests.workload(run, OWNER, role, 0, IMAGES)["spec"]["template"]["spec"]
        for role in ("trainer", "generator")
    }
    assert pod["trainer"]["tolerations"] == [pool]
    assert pod["generator"]["tolerations"] == []  # present, so it replaces the run's list
    assert pod["trainer"]["nodeSelector"] == pod["generator"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["generator"]["schedulerName"] == "volcano" and "schedulerName" not in pod["trainer"]


def test_pods_name_their_user_ids_unless_the_platform_assigns_them() -> None:
    fixed = manifests.workload(RUN, OWNER, "trainer", 0, IMAGES)["spec"]["template"]["spec"]
    assert fixed["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",  # no walk of the model volume at every start
    }
    assigned = Images(run_as=None)
    for job in (
        manifests.workload(RUN, OWNER, "generator", 0, assigned),
        manifests.fit_job(RUN, OWNER, 1, assigned),
    ):
        security = job["spec"]["template"]["spec"]["securityContext"]
        assert security == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(
    ("raw", "user"), [("10001", 10001), ("1000680000", 1000680000), ("", None)]
)
def test_the_chart_says_the_pods_user_id_or_leaves_it_to_the_platform(
    raw: str, user: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCALERL_RUN_AS_USER", raw)
    assert images_from_environ().run_as == user


@pytest.mark.parametrize("raw", ["0", "root", "-5"])
def test_root_or_a_name_is_no_user_id(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALERL_RUN_AS_USER", raw)
    with pytest.raises(InputError, match="SCALERL_RUN_AS_USER must be a non-root user ID"):
        images_from_environ()


def queued(raw_changes: dict[str, Any] | None = None, **scheduling: Any) -> ScaleRLRun:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["scheduling"] = {"queueName": "gpus", **scheduling}
    raw.update(raw_changes or {})
    return parse_run(raw)


def test_a_queued_run_is_one_suspended_jobset_holding_its_two_jobs() -> None:
    run = queued(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    (jobset,) = manifests.workloads(run, OWNER, 2, IMAGES)
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"]["name"] == RUN.name
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"
    assert jobset["metadata"]["labels"][names.LABEL_ATTEMPT] == "2"
    assert jobset["metadata"]["ownerReferences"] == [OWNER.reference()]
    spec = jobset["spec"]
    assert spec["suspend"] is True  # no pod before Kueue admits the whole gang
    assert spec["failurePolicy"] == {"maxRestarts": 0}  # the operator restarts gangs
    assert spec["network"] == {"enableDNSHostnames": False}  # pods keep the run's subdomain
    # Each replicated Job is the plain run's Job, labels and pod template alike.
    for replicated in spec["replicatedJobs"]:
        job = manifests.workload(run, OWNER, replicated["name"], 2, IMAGES)
        assert replicated["replicas"] == 1
        assert replicated["template"] == {
            "metadata": {"labels": job["metadata"]["labels"]},
            "spec": job["spec"],
        }
        pod = job["spec"]["template"]["spec"]
        assert "queueName" not in pod and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert [r["name"] for r in spec["replicatedJobs"]] == ["trainer", "generator"]


def test_the_run_s_kueue_label_names_its_queue_and_the_spec_wins() -> None:
    label = {"metadata": {"name": RUN.name, "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}}
    assert queued(label).queue_name == "gpus"
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw.update(label)
    assert parse_run(raw).queue_name == "team-a"
    assert RUN.queue_name is None
    assert all(job["kind"] == "Job" for job in manifests.workloads(RUN, OWNER, 0, IMAGES))


def test_a_queued_run_s_longest_name_fits_its_jobset_s_pods() -> None:
    name = "r" * names.MAX_QUEUED_RUN_NAME
    assert names.name_problems(name, queued=True) == []
    assert names.name_problems(name + "r", queued=True)
    assert names.name_problems(name + "r") == []  # the same name is fine without a queue
    assert len(f"{names.gang_job(name, 'generator')}-9999") <= 63


def test_an_init_container_makes_the_run_directory_as_the_pods_user_where_asked() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    assert "initContainers" not in manifests.workload(RUN, OWNER, "trainer", 0, IMAGES)["spec"]
    raw["spec"]["checkpoint"] = {"claimName": "store", "createRunDirectory": True}
    run = parse_run(raw)
    for role in ("trainer", "generator"):  # either may start first and mount runs/<run>
        pod = manifests.workload(run, OWNER, role, 0, IMAGES)["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["command"] == ["mkdir", "-p", f"/store/runs/{run.name}"]
        assert init["volumeMounts"] == [{"name": "store", "mountPath": "/store"}]
        assert init["image"] == pod["containers"][0]["image"]
        assert init["securityContext"] == pod["containers"][0]["securityContext"]
        assert "runAsUser" not in init["securityContext"]  # the pod's user, as the trainer's
    raw["spec"]["checkpoint"] = {"createRunDirectory": True}  # no claim: an emptyDir, no init
    pod = manifests.workload(parse_run(raw), OWNER, "trainer", 0, IMAGES)["spec"]["template"]
    assert "initContainers" not in pod["spec"]


@pytest.mark.parametrize("run_as", [2000, None])
def test_a_run_may_name_its_own_pod_user_or_leave_it_to_the_platform(run_as: int | None) -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["podSecurity"] = {"runAsUser": run_as}
    run = parse_run(raw)
    pods = [
        manifests.workload(run, OWNER, "trainer", 0, IMAGES)["spec"]["template"]["spec"],
        manifests.fit_job(run, OWNER, 1, IMAGES)["spec"]["template"]["spec"],
    ]
    for pod in pods:
        ids = {k: v for k, v in pod["securityContext"].items() if k in ("runAsUser", "fsGroup")}
        assert ids == ({} if run_as is None else {"runAsUser": run_as, "fsGroup": run_as})
    # Without the field, the operator's setting (IMAGES: our images' user).
    trainer = manifests.workload(RUN, OWNER, "trainer", 0, IMAGES)["spec"]["template"]["spec"]
    assert trainer["securityContext"]["runAsUser"] == manifests.RUN_AS


def test_a_run_s_pod_user_is_never_root() -> None:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["podSecurity"] = {"runAsUser": 0}
    with pytest.raises(SpecError, match="spec.podSecurity.runAsUser"):
        parse_run(raw)
