"""Every object the operator builds for a run passes Kubernetes' own schemas (kubernetes-validate,
strict: no unknown fields), for runs of several shapes: GPUs or CPU, a checkpoint claim or none,
images of the run's own, colocated (one pod) or not, the NetworkPolicy on, off or without metrics
namespaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from small_run import run_manifest

from scalerl.operator import manifests
from scalerl.operator.manifests import Images, NetworkSettings, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import ScaleRLRun, load_run, parse_run

ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.30.0"  # the chart's kubeVersion floor

RUNS = {
    "example": lambda: load_run(ROOT / "examples" / "run.yaml"),
    "small": lambda: parse_run(run_manifest("research", "r1")),
    "cpu-own-images": lambda: parse_run(
        run_manifest(
            "research",
            "cpu-run",
            generators={"replicas": 1, "gpus": 0, "image": "registry.example/gen:1"},
            trainers={
                "replicas": 1,
                "gpus": 0,
                "image": "registry.example/train:1",
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": 4}},
            },
            checkpoint={"claimName": None},
        )
    ),
    "nfs-claim": lambda: parse_run(
        run_manifest("research", "nfs", checkpoint={"claimName": "nfs", "createRunDirectory": True})
    ),
    "colocated-gpu": lambda: parse_run(
        run_manifest("research", "one-gpu", placement="colocated", generators={"replicas": 1})
    ),
    "colocated-cpu": lambda: parse_run(
        run_manifest(
            "research",
            "one-cpu",
            placement="colocated",
            generators={"replicas": 1, "gpus": 0},
            trainers={"replicas": 1, "gpus": 0},
            checkpoint={"claimName": None},
        )
    ),
}
NETWORKS = {
    "policy": NetworkSettings(),
    "no-policy": NetworkSettings(enabled=False),
    "policy-no-metrics": NetworkSettings(metrics_namespaces=()),
}
BUILT = {"ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "Service", "Job"}
KEYS = StreamKeys.generate()


def objects(run: ScaleRLRun, network: NetworkSettings) -> list[dict[str, Any]]:
    owner = Owner(run.name, "research", "0b7c5a52-3f3e-4c0e-9d8e-5b1f0c2d9a11")
    images = Images()
    return [
        *manifests.children(run, owner, 2, images, KEYS, network),
        manifests.fit_job(run, owner, 1, images),
    ]


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("run", RUNS)
def test_every_object_of_a_run_passes_kubernetes_schemas(run: str, network: str) -> None:
    objs = objects(RUNS[run](), NETWORKS[network])
    kinds = {obj["kind"] for obj in objs}
    assert kinds == BUILT | ({"NetworkPolicy"} if NETWORKS[network].enabled else set())
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {where}: {err.message}")


@pytest.mark.parametrize("run", ["colocated-gpu", "colocated-cpu"])
def test_a_colocated_run_validates_as_one_trainer_pod(run: str) -> None:
    """The colocated shapes above are the ones meant: one workload, the trainer's."""
    jobs = [o for o in objects(RUNS[run](), NETWORKS["policy"]) if o["kind"] == "Job"]
    roles = [job["metadata"]["labels"]["scalerl.dev/role"] for job in jobs]
    assert roles == ["trainer", "fit"]
    assert jobs[0]["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "scalerl",
        "colocated",
    ]


def test_the_cpu_run_has_no_gpu_and_its_own_images() -> None:
    """The shapes above are the ones meant: nothing asks for a GPU, the run's images win."""
    objs = objects(RUNS["cpu-own-images"](), NETWORKS["policy"])
    jobs = {
        obj["metadata"]["labels"]["scalerl.dev/role"]: obj["spec"]["template"]["spec"]
        for obj in objs
        if obj["kind"] == "Job"
    }
    assert set(jobs) == {"trainer", "generator", "fit"}
    assert jobs["trainer"]["containers"][0]["image"] == "registry.example/train:1"
    assert jobs["generator"]["containers"][0]["image"] == "registry.example/gen:1"
    for spec in jobs.values():
        assert "nvidia.com/gpu" not in str(spec["containers"][0].get("resources"))
    assert {"name": "checkpoints", "emptyDir": {}} in jobs["trainer"]["volumes"]


@pytest.mark.parametrize("run", ["small", "nfs-claim"])
def test_a_queued_run_s_jobset_holds_jobs_that_pass_kubernetes_schemas(run: str) -> None:
    queued = RUNS[run]()
    raw = manifests.run_document(queued, "research")
    raw["spec"]["scheduling"]["queueName"] = "gpus"
    owner = Owner(queued.name, "research", "0b7c5a52-3f3e-4c0e-9d8e-5b1f0c2d9a11")
    (jobset,) = manifests.workloads(parse_run(raw), owner, 0, Images())
    for replicated in jobset["spec"]["replicatedJobs"]:
        template = replicated["template"]
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{queued.name}-{replicated['name']}-0", **template["metadata"]},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
