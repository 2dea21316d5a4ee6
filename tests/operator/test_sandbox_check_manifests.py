"""The sandbox check Job of a run that scores model-written code, and the settings the pods that
run the programs get (`data.code.unmaskedProc`).

job = sandboxcheck.job(run, owner, images)   # `scalerl sandbox-check` in a code pod's settings
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from small_run import run_manifest

from scalerl.operator import codepods, gang, names, sandboxcheck
from scalerl.operator.objects import Images, Owner
from scalerl.spec import ScaleRLRun, parse_run

OWNER = Owner("r1", "research", "0b7c5a52-3f3e-4c0e-9d8e-5b1f0c2d9a11")
SCHEDULING = {
    "runtimeClassName": "gvisor",
    "nodeSelector": {"pool": "gen"},
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
}


def run_of(code: dict[str, Any] | None = None, **spec: Any) -> ScaleRLRun:
    data = {"reward": "code", **({"code": code} if code is not None else {})}
    return parse_run(run_manifest("research", "r1", data=data, **spec))


def pod_of(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"])


def role_pod(run: ScaleRLRun, role: str) -> dict[str, Any]:
    return pod_of(gang.workload(run, OWNER, role, 0, Images()))


def test_the_check_runs_in_the_generators_image_and_settings_without_gpu_token_or_volume() -> None:
    run = run_of(generators={"replicas": 2, "gpus": 1, "scheduling": SCHEDULING})
    job = sandboxcheck.job(run, OWNER, Images())
    pod, generator = pod_of(job), role_pod(run, names.ROLE_GENERATOR)
    (container,) = pod["containers"]
    assert job["metadata"]["name"] == "r1-sandbox-check"
    assert job["metadata"]["labels"][names.LABEL_ROLE] == "sandbox-check"
    assert job["spec"]["backoffLimit"] == 0
    assert container["command"] == ["scalerl", "sandbox-check"]
    assert container["image"] == generator["containers"][0]["image"] == "scalerl/generator:0.1.0"
    assert container["securityContext"] == generator["containers"][0]["securityContext"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "nvidia.com/gpu" not in str(container["resources"])
    for field in ("securityContext", "runtimeClassName", "nodeSelector", "tolerations"):
        assert pod[field] == generator[field], field
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert "volumes" not in pod and "volumeMounts" not in container
    kubernetes_validate.validate(job, "1.30.0", strict=True)


def test_a_colocated_run_checks_in_its_one_role_s_settings_and_image() -> None:
    run = run_of(
        placement="colocated",
        generators={"replicas": 1},
        trainers={"replicas": 1, "image": "registry.example/one:2", "scheduling": SCHEDULING},
    )
    (container,) = pod_of(sandboxcheck.job(run, OWNER, Images()))["containers"]
    assert container["image"] == "registry.example/one:2"
    assert pod_of(sandboxcheck.job(run, OWNER, Images()))["runtimeClassName"] == "gvisor"


def test_unmasked_proc_goes_to_the_pods_that_run_code_and_to_the_check_only() -> None:
    run = run_of({"unmaskedProc": True})
    check = pod_of(sandboxcheck.job(run, OWNER, Images()))
    generator, trainer = (role_pod(run, r) for r in (names.ROLE_GENERATOR, names.ROLE_TRAINER))
    for pod in (check, generator):
        assert pod["hostUsers"] is False
        assert pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "hostUsers" not in trainer
    assert "procMount" not in trainer["containers"][0]["securityContext"]
    colocated = run_of({"unmaskedProc": True}, placement="colocated", generators={"replicas": 1})
    assert role_pod(colocated, names.ROLE_TRAINER)["hostUsers"] is False
    plain = run_of()
    assert "hostUsers" not in role_pod(plain, names.ROLE_GENERATOR)


def test_a_run_without_code_needs_no_check_and_its_pods_are_unchanged() -> None:
    run = parse_run(run_manifest("research", "r1", data={"reward": "math"}))
    assert not codepods.scores_code(run)
    source_code = parse_run(
        run_manifest(
            "research",
            "r1",
            data={"train": [{"path": "/d/a.jsonl"}, {"path": "/d/c.jsonl", "reward": "code"}]},
        )
    )
    assert codepods.scores_code(source_code)  # one source's reward is enough


def test_plain_processes_asked_for_by_name_are_passed_to_the_check() -> None:
    (container,) = pod_of(sandboxcheck.job(run_of({"unsafeAllowPlain": True}), OWNER, Images()))[
        "containers"
    ]
    assert container["command"] == ["scalerl", "sandbox-check", "--allow-plain"]


@settings(max_examples=30, deadline=None)
@given(
    unmasked=st.booleans(),
    plain=st.booleans(),
    colocated=st.booleans(),
    image=st.sampled_from([None, "registry.example/gen:3"]),
)
def test_the_check_is_redone_exactly_when_what_it_checks_changes(
    unmasked: bool, plain: bool, colocated: bool, image: str | None
) -> None:
    def made(**code: Any) -> ScaleRLRun:
        spec: dict[str, Any] = {
            "generators": {"replicas": 1, **({"image": image} if image else {})}
        }
        if colocated:
            spec["placement"] = "colocated"
        return run_of({"unmaskedProc": unmasked, "unsafeAllowPlain": plain, **code}, **spec)

    base = sandboxcheck.key(made(), Images())
    assert sandboxcheck.key(made(testTimeoutSeconds=3), Images()) == base  # limits: not checked
    assert sandboxcheck.key(made(unmaskedProc=not unmasked), Images()) != base
    assert sandboxcheck.key(made(unsafeAllowPlain=not plain), Images()) != base
    # The generator image where the scoring role names none (a colocated run's is the trainers').
    other = Images(generator="registry.example/other:1")
    assert (sandboxcheck.key(made(), other) != base) == (image is None or colocated)


@pytest.mark.parametrize("unsafe", [False, True])
def test_the_check_job_passes_kubernetes_schemas(unsafe: bool) -> None:
    run = run_of({"unmaskedProc": True, "unsafeAllowPlain": unsafe})
    kubernetes_validate.validate(sandboxcheck.job(run, OWNER, Images()), "1.33.0", strict=True)
