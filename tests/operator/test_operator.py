"""The operator's behaviours, with kopf running unmodified against the API emulator."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from harness import (
    NS,
    RUNS,
    JobController,
    condition,
    create,
    operator,
    owned,
    patch_run,
    patch_run_status,
    phase_is,
    pods,
    run_manifest,
    set_phase,
    status,
)

from scalerl.metrics import RUN_GAUGES, RunMetrics
from scalerl.operator import crd
from scalerl.spec import parse_run

CHILDREN = {
    "configmaps": ["r1-config"],
    "jobs": ["r1-generator", "r1-trainer"],
    "networkpolicies": ["r1-network"],
    "rolebindings": ["r1-status"],
    "roles": ["r1-status"],
    "serviceaccounts": ["r1-status"],
    "secrets": ["r1-stream-keys"],
    "services": ["r1-trainer"],
}
GANG_PODS = 3  # 1 trainer + 2 generators
# Deadlines, not sleeps: generous, because a loaded 2-core machine can slow every request.
WAIT = 30.0


@pytest.fixture
def cluster(k8s: Any) -> Any:
    k8s.install_crd(crd.build_crd())
    return k8s


def events(k8s: Any, reason: str | None = None) -> list[dict[str, Any]]:
    """The run's Events, oldest first."""
    found = [
        e for e in k8s.objects("events", NS) if e["involvedObject"].get("kind") == "ScaleRLRun"
    ]
    found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e for e in found if reason is None or e["reason"] == reason]


def event_reasons(k8s: Any, *expected: str) -> list[str]:
    """Wait until the run's Events are `expected` (kopf posts them in the background)."""
    k8s.wait_for(lambda: [e["reason"] for e in events(k8s)] == list(expected), WAIT, f"{expected}")
    return list(expected)


def gang_up(k8s: Any, attempt: int = 0, size: int = GANG_PODS) -> list[dict[str, Any]]:
    """Wait for the gang of `attempt` to have all its `size` pods (and no other); return them."""

    def ready() -> list[dict[str, Any]] | None:
        found = [
            p
            for p in pods(k8s)
            if p["metadata"]["labels"].get("scalerl.dev/attempt") == str(attempt)
        ]
        return found if len(found) == size and len(pods(k8s)) == size else None

    return k8s.wait_for(ready, WAIT, f"the pods of gang attempt {attempt}")


def trainer(found: list[dict[str, Any]]) -> dict[str, Any]:
    return next(p for p in found if p["metadata"]["labels"]["scalerl.dev/role"] == "trainer")


def generator(found: list[dict[str, Any]]) -> dict[str, Any]:
    return next(p for p in found if p["metadata"]["labels"]["scalerl.dev/role"] == "generator")


def test_a_run_gets_every_child_owned_by_it(cluster: Any) -> None:
    with operator(cluster):
        run = create(cluster, run_manifest())
        started = time.monotonic()
        cluster.wait_for(
            lambda: {k: v for k, v in owned(cluster).items() if k != "pods"} == CHILDREN,
            WAIT,
            "every child",
        )
        elapsed = time.monotonic() - started
        cluster.wait_for(lambda: phase_is(cluster, "Pending"), WAIT)
        event_reasons(cluster, "Created")
    uid = run["metadata"]["uid"]
    for resource, names in CHILDREN.items():
        for name in names:
            child = cluster.get(resource, name)
            refs = child["metadata"]["ownerReferences"]
            assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [
                ("ScaleRLRun", uid, True)
            ]
            assert child["metadata"]["labels"]["scalerl.dev/run"] == "r1"
    assert condition(cluster, "Ready")["status"] == "True"
    assert status(cluster)["observedGeneration"] == run["metadata"]["generation"]
    print(f"create -> every child present: {elapsed:.2f} s")


def test_a_bad_spec_is_reported_field_by_field_and_nothing_is_created(cluster: Any) -> None:
    bad = run_manifest(recipe={"loss": {"type": "ppo"}, "batch": {"prompts": 0}})
    with operator(cluster):
        create(cluster, bad)
        ready = cluster.wait_for(lambda: condition(cluster, "Ready"), WAIT, "Ready")
        cluster.wait_for(lambda: events(cluster, "InvalidSpec"), WAIT, "the event")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    lines = ready["message"].splitlines()
    assert any(line.startswith("spec.recipe.loss.type:") for line in lines)
    assert any(line.startswith("spec.recipe.batch.prompts:") for line in lines)
    assert len(lines) == 2
    assert owned(cluster) == {}


def test_a_fixed_spec_starts_the_run(cluster: Any) -> None:
    with operator(cluster):
        create(cluster, run_manifest(recipe={"batch": {"prompts": 0}}))
        cluster.wait_for(lambda: (condition(cluster, "Ready") or {}).get("status") == "False", WAIT)
        patch_run(cluster, {"recipe": {"batch": {"prompts": 8}}})
        cluster.wait_for(lambda: (condition(cluster, "Ready") or {}).get("status") == "True", WAIT)
        cluster.wait_for(lambda: "jobs" in owned(cluster), WAIT)


def test_a_failed_pod_restarts_the_gang_until_the_bound_then_fails(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest(failurePolicy={"maxRestarts": 2}))
        gang = gang_up(cluster, 0)
        set_phase(cluster, trainer(gang), "Running")
        cluster.wait_for(lambda: phase_is(cluster, "Running"), WAIT, "Running")
        for attempt in (1, 2):
            set_phase(cluster, generator(gang), "Failed", exit_code=1)
            gang = gang_up(cluster, attempt)
            assert status(cluster)["restarts"] == attempt
            set_phase(cluster, trainer(gang), "Running")
            cluster.wait_for(lambda: phase_is(cluster, "Running"), WAIT, "Running again")
        set_phase(cluster, trainer(gang), "Failed", exit_code=137)
        cluster.wait_for(lambda: phase_is(cluster, "Failed"), WAIT, "Failed")
        cluster.wait_for(lambda: not pods(cluster) and "jobs" not in owned(cluster), WAIT)
        event_reasons(
            cluster, "Created", "Running", "GangRestart", "Running", "GangRestart", "Running",
            "RestartLimitExceeded",
        )  # fmt: skip
    final = status(cluster)
    assert final["restarts"] == 2
    assert "exit code 137" in final["message"] and "maxRestarts" in final["message"]
    assert condition(cluster, "Ready")["reason"] == "RestartLimitExceeded"


def test_a_colocated_run_is_one_pod_restarted_and_removed_alone(cluster: Any) -> None:
    colocated = run_manifest(placement="colocated", generators={"replicas": 1})
    with operator(cluster), JobController(cluster):
        create(cluster, colocated)
        (pod,) = gang_up(cluster, 0, size=1)
        assert owned(cluster)["jobs"] == ["r1-trainer"]
        assert pod["spec"]["containers"][0]["command"] == ["scalerl", "colocated"]
        set_phase(cluster, pod, "Running")
        cluster.wait_for(lambda: phase_is(cluster, "Running"), WAIT, "Running")
        set_phase(cluster, pod, "Failed", exit_code=1)
        (pod,) = gang_up(cluster, 1, size=1)
        assert status(cluster)["restarts"] == 1
        assert owned(cluster)["jobs"] == ["r1-trainer"]
        set_phase(cluster, pod, "Running")
        cluster.wait_for(lambda: phase_is(cluster, "Running"), WAIT, "Running again")
        event_reasons(cluster, "Created", "Running", "GangRestart", "Running")
        cluster.kubectl("delete", "srl", "r1", "--timeout=60s", timeout=90)
        cluster.wait_for(lambda: owned(cluster) == {}, WAIT, "no children")


def test_a_pod_of_an_old_gang_failing_restarts_nothing(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest())
        old = gang_up(cluster, 0)
        set_phase(cluster, old[0], "Failed", exit_code=1)
        gang_up(cluster, 1)
        stale = dict(old[1], metadata={**old[1]["metadata"], "name": "stale"})
        stale["metadata"].pop("resourceVersion", None)
        stale["metadata"].pop("uid", None)
        create(cluster, stale)
        set_phase(cluster, stale, "Failed", exit_code=1)
        time.sleep(0.5)  # nothing may happen: give the operator the time to do it wrongly
        assert status(cluster)["restarts"] == 1


def test_suspend_removes_the_pods_and_resume_starts_them_again(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest())
        gang_up(cluster, 0)
        patch_run(cluster, {"suspend": True})
        cluster.wait_for(lambda: phase_is(cluster, "Suspended"), WAIT, "Suspended")
        cluster.wait_for(lambda: not pods(cluster) and "jobs" not in owned(cluster), WAIT)
        assert condition(cluster, "Suspended")["status"] == "True"
        assert "configmaps" in owned(cluster)  # the run's config (and checkpoints) stay
        patch_run(cluster, {"suspend": False})
        gang_up(cluster, 0)
        cluster.wait_for(lambda: phase_is(cluster, "Pending"), WAIT)
        event_reasons(cluster, "Created", "Suspended", "Resumed")
    assert condition(cluster, "Suspended")["status"] == "False"
    assert status(cluster)["restarts"] == 0


def test_the_trainer_finishing_ends_the_run_succeeded(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest())
        gang = gang_up(cluster, 0)
        set_phase(cluster, trainer(gang), "Running")
        cluster.wait_for(lambda: phase_is(cluster, "Running"), WAIT, "Running")
        set_phase(cluster, trainer(gang), "Succeeded", exit_code=0)
        cluster.wait_for(lambda: phase_is(cluster, "Succeeded"), WAIT, "Succeeded")
        cluster.wait_for(lambda: not pods(cluster) and "jobs" not in owned(cluster), WAIT)
        event_reasons(cluster, "Created", "Running", "BudgetReached")


def test_an_operator_restart_creates_no_duplicates(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest())
        gang_up(cluster, 0)
        event_reasons(cluster, "Created")
    before = owned(cluster)
    creates = len([c for c in cluster.requests if c.verb == "create"])
    with operator(cluster), JobController(cluster):
        cluster.wait_for(lambda: cluster.get(RUNS, "r1")["metadata"]["annotations"], WAIT)
        time.sleep(1.0)  # the resume handler runs at start: let it (not) create anything
        assert owned(cluster) == before
    after = [c for c in cluster.requests[:] if c.verb == "create"][creates:]
    # The keys Secret is never read, only created: the server answers 409, nothing is made.
    assert [(c.resource, c.status) for c in after] == [("secrets", 409)]


def evaluations(count: int) -> dict[str, Any]:
    points = [
        {"step": 10 * i, "computeHours": 1.0 + i, "passRate": 0.2 + 0.01 * i} for i in range(count)
    ]
    return {"evaluations": points, "evaluationCount": count}


def fit_jobs(k8s: Any) -> list[str]:
    return [j for j in owned(k8s).get("jobs", []) if "-fit-" in j]


def test_every_n_evaluations_start_one_fit_job_at_a_time(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest(fit={"everyEvaluations": 3}))
        gang_up(cluster, 0)
        for count in (1, 2):
            patch_run_status(cluster, evaluations(count))
        time.sleep(0.5)
        assert fit_jobs(cluster) == []
        patch_run_status(cluster, evaluations(3))
        cluster.wait_for(lambda: fit_jobs(cluster) == ["r1-fit-1"], WAIT, "fit Job 1")
        for count in range(4, 8):  # the first fit still runs: no second one yet
            patch_run_status(cluster, evaluations(count))
        time.sleep(0.5)
        assert fit_jobs(cluster) == ["r1-fit-1"]
        fit_pod = cluster.wait_for(lambda: pods(cluster, role="fit"), WAIT)
        set_phase(cluster, fit_pod[0], "Succeeded", exit_code=0)  # the fit Job completes
        cluster.wait_for(lambda: fit_jobs(cluster) == ["r1-fit-1", "r1-fit-2"], WAIT, "fit Job 2")
    job = cluster.get("jobs", "r1-fit-1")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["scalerl", "fit", "--run", "r1", "--namespace", NS]
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert status(cluster)["fit"] == {"jobs": 2, "evaluations": 7}


def test_a_hopeless_prediction_stops_the_run(cluster: Any) -> None:
    stop = {"budget": {"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}}}
    hopeless = {
        "A": 0.3,
        "B": 1.5,
        "C_mid": 100.0,
        "R0": 0.1,
        "A_interval": [0.28, 0.33],
        "predictedAtBudget": 0.3,
        "budget": 1000.0,
        "points": 8,
        "fittedAt": "2026-11-23T00:00:00Z",
    }
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest(**stop))
        gang_up(cluster, 0)
        patch_run_status(cluster, {"prediction": {**hopeless, "points": 7}})
        time.sleep(0.5)
        assert phase_is(cluster, "Pending")  # too few points to be sure
        patch_run_status(cluster, {"prediction": hopeless})
        cluster.wait_for(lambda: phase_is(cluster, "Failed"), WAIT, "stopped")
        cluster.wait_for(lambda: not pods(cluster), WAIT)
    stopped = condition(cluster, "Stopped")
    assert stopped["status"] == "True" and stopped["reason"] == "PredictedBelowTarget"
    assert "0.330" in stopped["message"]


def test_deleting_the_run_removes_every_child(cluster: Any) -> None:
    with operator(cluster), JobController(cluster):
        create(cluster, run_manifest())
        gang_up(cluster, 0)
        cluster.kubectl("delete", "srl", "r1", "--timeout=60s", timeout=90)
        cluster.wait_for(lambda: owned(cluster) == {}, WAIT, "no children")
    assert cluster.get(RUNS, "r1") is None


def test_kubectl_get_srl_shows_the_prediction_columns(cluster: Any) -> None:
    with operator(cluster):
        create(cluster, run_manifest())
        cluster.wait_for(lambda: phase_is(cluster, "Pending"), WAIT)
        patch_run_status(
            cluster,
            {
                "progress": {"step": 420, "evalPassRate": 0.52, "truncationRate": 0.031},
                "prediction": {"A": 0.61, "C_mid": 2542.0},
            },
        )
        out = cluster.kubectl("get", "srl").stdout.splitlines()
    assert out[0].split() == ["NAME", "PHASE", "STEP", "PASSRATE", "A", "C_MID", "TRUNC", "AGE"]
    assert out[1].split()[:7] == ["r1", "Pending", "420", "0.52", "0.61", "2542", "0.031"]


def test_the_operator_exports_each_runs_prediction_target_and_restarts(cluster: Any) -> None:
    metrics = RunMetrics()

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"scalerl_{name}", {"namespace": NS, "run": "r1"})

    stop = {"budget": {"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}}}
    with operator(cluster, metrics=metrics):
        create(cluster, run_manifest(**stop))
        cluster.wait_for(lambda: sample("gang_restarts") == 0, WAIT, "the restarts gauge")
        assert sample("target_asymptote") == 0.5
        assert sample("predicted_asymptote") is None  # no fit yet: no series, not a zero
        fit = {"A": 0.61, "B": 1.4, "C_mid": 2542.0, "R0": 0.05, "points": 5}
        patch_run_status(cluster, {"prediction": fit})
        cluster.wait_for(lambda: sample("predicted_asymptote") == 0.61, WAIT, "the prediction")
        assert (sample("predicted_cmid"), sample("predicted_slope")) == (2542.0, 1.4)
        cluster.kubectl("delete", "srl", "r1", "--timeout=60s", timeout=90)
        cluster.wait_for(lambda: sample("gang_restarts") is None, WAIT, "the run's series gone")


def test_same_named_runs_in_two_namespaces_keep_their_own_series(cluster: Any) -> None:
    # r1 in `default` and r1 in `team-b`: two runs, two sets of series; deleting one keeps the
    # other's (DESIGN.md, "Metrics": labels `namespace` and `run`).
    metrics = RunMetrics()
    other = "team-b"

    def sample(name: str, namespace: str) -> float | None:
        labels = {"namespace": namespace, "run": "r1"}
        return metrics.registry.get_sample_value(f"scalerl_{name}", labels)

    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    with operator(cluster, metrics=metrics):
        create(cluster, run_manifest(budget={"stopWhen": {"predictedABelow": 0.5}}))
        theirs = run_manifest(budget={"stopWhen": {"predictedABelow": 0.7}})
        theirs["metadata"]["namespace"] = other
        reply = cluster.api("POST", f"/apis/scalerl.dev/v1alpha1/namespaces/{other}/{RUNS}", theirs)
        assert reply.status == 201, reply.body
        cluster.wait_for(
            lambda: sample("gang_restarts", NS) == 0 == sample("gang_restarts", other),
            WAIT,
            "both runs' restarts gauges",
        )
        assert (sample("target_asymptote", NS), sample("target_asymptote", other)) == (0.5, 0.7)
        cluster.kubectl("delete", "srl", "r1", "-n", other, "--timeout=60s", timeout=90)
        cluster.wait_for(
            lambda: sample("gang_restarts", other) is None, WAIT, "team-b's series gone"
        )
        assert {name: sample(name, other) for name in RUN_GAUGES} == dict.fromkeys(RUN_GAUGES)
        assert (sample("gang_restarts", NS), sample("target_asymptote", NS)) == (0, 0.5)


def test_the_pods_read_their_runs_namespace_from_the_config_map(cluster: Any) -> None:
    # The processes label their series with the namespace of the spec the ConfigMap holds.
    with operator(cluster):
        create(cluster, run_manifest())
        cluster.wait_for(lambda: cluster.get("configmaps", "r1-config"), WAIT, "the ConfigMap")
    (text,) = cluster.get("configmaps", "r1-config")["data"].values()
    assert parse_run(yaml.safe_load(text)).namespace == NS
