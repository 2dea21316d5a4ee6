"""A run that scores model-written code, on the real control plane: before its gang exists, the
operator's sandbox check Job makes one sandbox in a pod with the code-running pods' settings; a
cluster that cannot isolate the programs fails the run then (SandboxUnavailable, in the check's
own words), with no trainer or generator pod made.

The check's pod runs where its image is one the test kubelet was given, with Podman: an image
with bubblewrap and scalerl (containers.sandbox_image), under Podman's default seccomp profile
and the pod's securityContext. Its other pods are processes of this machine, where bubblewrap
works. The runs ask for GPUs, which the test kubelet's node has none of: their gang pods stay
Pending, so no training process runs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import containers
import pytest
from chart import in_thread
from controlplane import ControlPlane
from kubelet import Kubelet, printing_logs_on_failure
from runs import RUNS, condition, ensure_crd, listed, phase_is, pods, status, wait_for
from small_run import run_manifest

from scalerl.operator import names
from scalerl.operator.objects import Images

CHECK_S = 120.0  # the check pod's start (a Podman container, scalerl's imports) and its sandbox
# What the check says of a sandbox in a restricted pod (its /proc masked).
WITHOUT_A_PROC = (
    "sandbox: bwrap; its programs see no /proc (bubblewrap refused a /proc of its own (bwrap: "
    "Can't mount proc on /newroot/proc: Operation not permitted): this /proc is masked"
)
REACHED_NOTHING = (
    "a program in it reached nothing: not this process's environment nor any under /proc, not a "
    "file of this user, not 127.0.0.1"
)
SCORED = (
    "it scored a right program +1 and a wrong one -1 in stdin/stdout, call-based, asserts tests"
)


def code_run(ns: str, placement: str | None = None, **code: Any) -> dict[str, Any]:
    shape: dict[str, Any] = {}
    if placement is not None:
        shape = {"placement": placement, "generators": {"replicas": 1}}
    return run_manifest(ns, data={"reward": "code", "code": code}, **shape)


@contextlib.contextmanager
def operating(
    plane: ControlPlane,
    ns: str,
    kubeconfig: Path,
    images: dict[str, str] | None = None,
    check_interval_s: float = 3600.0,
) -> Iterator[Kubelet]:
    ensure_crd(plane)
    with (
        in_thread(plane, kubeconfig, [ns], check_interval_s=check_interval_s),
        Kubelet(plane, ns, images=images or {}) as kubelet,
        printing_logs_on_failure(kubelet),
    ):
        yield kubelet


def create(plane: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    code, made = plane.api("POST", f"{RUNS}/{ns}/scalerlruns", body)
    assert code == 201, made


def roles(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["labels"][names.LABEL_ROLE] for o in objs)


def check_pod(plane: ControlPlane, ns: str) -> str:
    """The name of the sandbox check's pod."""
    found = wait_for(lambda: pods(plane, ns, role=names.ROLE_SANDBOX_CHECK), "the check's pod")
    return str(found[0]["metadata"]["name"])


def failed_before_its_gang(plane: ControlPlane, ns: str) -> dict[str, Any]:
    """The run's status once Failed; no trainer or generator Job or pod was ever made."""
    wait_for(lambda: phase_is(plane, ns, "Failed"), "Failed", CHECK_S)
    assert roles(listed(plane, ns, "jobs")) == [names.ROLE_SANDBOX_CHECK]
    assert roles(pods(plane, ns)) in ([], [names.ROLE_SANDBOX_CHECK])
    return status(plane, ns)


def test_a_code_run_starts_its_gang_once_the_check_made_a_sandbox(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path
) -> None:
    with operating(plane, ns, operator_kubeconfig) as kubelet:
        create(plane, ns, code_run(ns))
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting", CHECK_S)
        ready = condition(plane, ns, "SandboxReady")
        assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Checked")
        assert "a generator pod's settings make a sandbox" in ready["message"]
        check = check_pod(plane, ns)  # its log says which sandbox the generators get
        said = kubelet.log(check).splitlines()[-3:]
        assert said == ["sandbox: bwrap", REACHED_NOTHING, SCORED]
        (job,) = [j for j in listed(plane, ns, "jobs") if roles([j]) == [names.ROLE_SANDBOX_CHECK]]
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False and "volumes" not in pod
        assert "resources" not in pod or not pod["resources"].get("limits")
        wait_for(lambda: len(pods(plane, ns, role=names.ROLE_GENERATOR)) == 2, "generator pods")


@pytest.mark.parametrize("placement", ["generators", "colocated"])
def test_in_a_restricted_pod_podman_makes_a_sandbox_without_a_proc_and_the_gang_starts(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path, placement: str
) -> None:
    """Restricted Pod Security keeps /proc masked, and the kernel refuses the sandbox a /proc of
    its own there: the sandbox goes without one (its supervisor adds a program's processes up in
    the pod's). Under Podman's default seccomp profile, in the code pods' restricted settings (a
    colocated run's one pod holds the run's token too), a program in it reaches nothing, known
    programs score as they should, and the run starts its gang."""
    images = {Images().generator: containers.sandbox_image()}
    colocated = placement == "colocated"
    role = names.ROLE_TRAINER if colocated else names.ROLE_GENERATOR
    with operating(plane, ns, operator_kubeconfig, images) as kubelet:
        create(plane, ns, code_run(ns, "colocated" if colocated else None))
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting", CHECK_S)
        ready = condition(plane, ns, "SandboxReady")  # the check's own words, in status
        assert ready is not None and ready["status"] == "True"
        made = f"a {role} pod's settings make a sandbox (Job r1-sandbox-check): "
        assert ready["message"].startswith(made + WITHOUT_A_PROC), ready["message"]
        assert ready["message"].endswith(f"; {REACHED_NOTHING}; {SCORED}")
        check = check_pod(plane, ns)
        assert kubelet.in_image(check) == containers.sandbox_image()
        said = kubelet.log(check).splitlines()
        assert said[-3].startswith(WITHOUT_A_PROC) and said[-2:] == [REACHED_NOTHING, SCORED]
        scoring = wait_for(lambda: pods(plane, ns, role=role), f"{role} pods")
        for pod in scoring:  # restricted as every run pod: no user namespace, /proc masked
            assert "hostUsers" not in pod["spec"]
            assert "procMount" not in pod["spec"]["containers"][0]["securityContext"]


def test_an_image_without_bubblewrap_fails_the_run_before_its_gang(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path
) -> None:
    """The operator's own image has no bubblewrap: a generator image like it makes no sandbox,
    and the run fails with SandboxUnavailable before any trainer or generator pod exists."""
    images = {Images().generator: containers.operator_image()}
    with operating(plane, ns, operator_kubeconfig, images) as kubelet:
        create(plane, ns, code_run(ns))
        ended = failed_before_its_gang(plane, ns)
        check = check_pod(plane, ns)
        assert kubelet.in_image(check) == containers.operator_image()
    reasons = {c["type"]: c for c in ended["conditions"]}
    assert (reasons["Ready"]["reason"], reasons["SandboxReady"]["reason"]) == (
        "SandboxUnavailable",
        "SandboxUnavailable",
    )
    assert ended["message"].startswith(
        "no sandbox for model-written code in a generator pod's settings (Job r1-sandbox-check): "
        "no sandbox for model-written code: bubblewrap (bwrap) is not installed. install "
        "bubblewrap"
    )
    assert "unsafeAllowPlain: true" in ended["message"]  # what to change, and what it costs


def test_with_an_unmasked_proc_in_a_baseline_namespace_podman_makes_the_full_sandbox(
    plane: ControlPlane, operator_kubeconfig: Path
) -> None:
    """data.code.unmaskedProc: the check's pod and those that will run the programs get a user
    namespace and an unmasked /proc, which the baseline level admits: there the sandbox has a
    /proc of its own (limits on a program's processes together), and a program in it reaches
    nothing."""
    first = len(plane.made)
    ns = plane.namespace("t-sandbox-unmasked", enforce="baseline")
    images = {Images().generator: containers.sandbox_image()}
    try:
        with operating(plane, ns, operator_kubeconfig, images) as kubelet:
            create(plane, ns, code_run(ns, unmaskedProc=True))
            wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting", CHECK_S)
            ready = condition(plane, ns, "SandboxReady")
            assert ready is not None and ready["message"] == (
                "a generator pod's settings make a sandbox (Job r1-sandbox-check): sandbox: "
                f"bwrap; {REACHED_NOTHING}; {SCORED}"
            )
            check = check_pod(plane, ns)
            assert kubelet.in_image(check) == containers.sandbox_image()
            said = kubelet.log(check).splitlines()[-3:]
            assert said == ["sandbox: bwrap", REACHED_NOTHING, SCORED]
            scoring = wait_for(lambda: pods(plane, ns, role=names.ROLE_GENERATOR), "generators")
            for pod in scoring:  # the pods that will run the programs get the same settings
                assert pod["spec"]["hostUsers"] is False
                assert pod["spec"]["containers"][0]["securityContext"]["procMount"] == "Unmasked"
            (trainer,) = pods(plane, ns, role=names.ROLE_TRAINER)
            assert "hostUsers" not in trainer["spec"]
    finally:
        plane.clear_runs(plane.made[first:])


def test_an_unmasked_proc_in_a_restricted_namespace_fails_with_pod_security_s_words(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path
) -> None:
    # The refusal is an Event on the Job, which changes nothing the operator watches: its
    # periodic check (every 30 s by default) reads it.
    with operating(plane, ns, operator_kubeconfig, check_interval_s=2.0):
        create(plane, ns, code_run(ns, unmaskedProc=True))
        ended = failed_before_its_gang(plane, ns)
    assert "violates PodSecurity" in ended["message"]
    assert 'procMount to "Unmasked"' in ended["message"]


def test_plain_processes_asked_for_by_name_pass_the_check_and_say_so(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path
) -> None:
    images = {Images().generator: containers.operator_image()}  # no bubblewrap in it
    with operating(plane, ns, operator_kubeconfig, images) as kubelet:
        create(plane, ns, code_run(ns, unsafeAllowPlain=True))
        wait_for(lambda: phase_is(plane, ns, "Starting"), "Starting", CHECK_S)
        check = check_pod(plane, ns)
        said = kubelet.log(check).splitlines()
    (mode,) = [line for line in said if line.startswith("sandbox:")]
    assert mode.startswith("sandbox: plain; without: private filesystem")
    assert mode.endswith("(bubblewrap (bwrap) is not installed)")
    # What the check shows a plain process reaching in its pod: the environment another
    # process of its user started with and a file of its user; not the network (its seccomp
    # filter refuses every socket but a Unix one, in plain mode too).
    assert re.fullmatch(
        r"a program in it reached: /proc/\d+/environ, a file of this user \(.*\)", said[-2]
    )
    assert said[-1] == SCORED
