"""The track record on the real control plane: two runs, each fitted by `fit_run` (the fit Job's
code) at 20, 45 and 70 % of its budget, then finished by its trainer; the operator scores each
run's status.trackRecord when the run Succeeds and pools them into its track-record gauges. The
gauges are checked against the predictions the fits returned and the runs' last evaluations."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from chart import in_thread, kube_from
from controlplane import ControlPlane
from runs import (
    GANG_PODS,
    attempt_of,
    create_run,
    ensure_crd,
    of_role,
    patch_run,
    patch_run_status,
    phase_is,
    pods,
    set_phase,
    set_running,
    status,
    wait_for,
)
from small_run import run_manifest

from scalerl.metrics import RunMetrics
from scalerl.operator import names
from scalerl.operator.prediction import fit_run
from scalerl.status.kubernetes import RunStatus

BUDGET = 100.0  # GPU-hours: maxComputeHours ends both runs
EVALUATIONS = 21  # one every 5 GPU-hours, 0 to 100
FITS = {5: 0.25, 10: 0.5, 15: 0.75}  # fit after n evaluations (20, 45, 70 %) -> the fraction it
# is the latest prediction by
LAWS = {"r1": (0.7, 1.5, 30.0, 0.2), "r2": (0.5, 2.0, 60.0, 0.1)}  # A, B, C_mid, R0


def evaluations(law: tuple[float, float, float, float], count: int) -> list[dict[str, Any]]:
    """status.evaluations as trainer 0 writes them, on the law (the second run a little above
    it at the end, so that its early predictions miss)."""
    A, B, C_mid, R0 = law
    out = []
    for i in range(count):
        compute = 5.0 * i
        rate = R0 if i == 0 else R0 + (A - R0) / (1.0 + (C_mid / compute) ** B)
        bump = 0.03 * (i / (EVALUATIONS - 1)) ** 4 if A < 0.6 else 0.0
        out.append(
            {
                "step": 10 * i,
                "computeHours": compute,
                "passRate": round(rate + bump, 6),
                "passRateSE": 0.01,
            }
        )
    return out


@pytest.fixture(scope="module")
def kubeconfig(plane: ControlPlane, operator_kubeconfig: Path) -> Path:
    ensure_crd(plane)
    return operator_kubeconfig


def test_the_operators_track_record_gauges_pool_the_finished_runs(
    plane: ControlPlane, ns: str, kubeconfig: Path
) -> None:
    metrics = RunMetrics()
    fit_job = kube_from(plane.kubeconfig, "scalerl-fit")  # the fit Job, as the admin
    spec = {
        "fit": {"everyEvaluations": 10_000, "minCompute": 0},  # the test fits, not fit Jobs
        "budget": {"maxComputeHours": BUDGET, "maxSteps": 100_000},
    }
    predictions: dict[str, dict[float, dict[str, Any]]] = {}
    with in_thread(plane, kubeconfig, [ns], metrics=metrics):
        for name, law in LAWS.items():
            create_run(plane, ns, run_manifest(ns, name=name, **spec))
            gang = gang_up_of(plane, ns, name)
            set_running(plane, ns, gang)
            wait_for(lambda n=name: phase_is(plane, ns, "Running", n), f"{name} Running")
            predictions[name] = {}
            for count, seen in FITS.items():
                patch_run_status(plane, ns, {"evaluations": evaluations(law, count)}, run=name)
                made = fit_run(RunStatus(fit_job, ns, name), bootstrap=40)
                assert made, f"{name}: no fit of {count} evaluations"
                predictions[name][seen] = made
            patch_run_status(plane, ns, {"evaluations": evaluations(law, EVALUATIONS)}, run=name)
            set_phase(plane, ns, of_role(gang, "trainer"), "Succeeded", exit_code=0)
            wait_for(lambda n=name: phase_is(plane, ns, "Succeeded", n), f"{name} Succeeded")

        def scored(name: str) -> dict[str, Any] | None:
            record = status(plane, ns, name).get("trackRecord") or {}
            return record if record.get("outcome") else None

        records = {name: wait_for(lambda n=name: scored(n), f"{name} scored") for name in LAWS}

        def gauge(name: str, seen: float) -> float | None:
            labels = {"seen": f"{seen:g}"}
            return metrics.registry.get_sample_value(f"scalerl_track_record_{name}", labels)

        wait_for(lambda: all(gauge("runs", s) == 2 for s in FITS.values()), "both runs pooled")
        for seen in FITS.values():
            # From the statuses: what each fit said (status.prediction then) and each run's last
            # evaluation (status.evaluations).
            outcomes = []
            for name, law in LAWS.items():
                actual = evaluations(law, EVALUATIONS)[-1]["passRate"]
                made = predictions[name][seen]
                interval = made["predictedAtBudgetInterval"]
                assert interval is not None, f"{name}: a fit without an interval: {made}"
                lo, hi = interval
                outcomes.append((made["predictedAtBudget"] - actual, lo <= actual <= hi, hi - lo))
                kept = next(p for p in records[name]["predictions"] if p["seen"] == seen)
                assert kept["predictedAtBudget"] == made["predictedAtBudget"]
                assert records[name]["outcome"]["passRate"] == actual
            median_error = statistics.median(e for e, _, _ in outcomes)
            assert gauge("median_error", seen) == pytest.approx(median_error, abs=1e-5)
            assert gauge("coverage", seen) == pytest.approx(sum(i for _, i, _ in outcomes) / 2)
            median_width = statistics.median(w for _, _, w in outcomes)
            assert gauge("median_width", seen) == pytest.approx(median_width, abs=1e-5)
            print(
                f"seen {seen:.0%}: median error {median_error:+.4f}, "
                f"coverage {gauge('coverage', seen):.0%}, median width {median_width:.4f}"
            )


def gang_up_of(plane: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    """The pods of run `name`'s first gang (runs.gang_up reads run r1's)."""

    def ready() -> list[dict[str, Any]] | None:
        found = [
            p
            for p in pods(plane, ns, run=name)
            if p["metadata"]["labels"][names.LABEL_ROLE] != names.ROLE_FIT
        ]
        return (
            found if len(found) == GANG_PODS and all(attempt_of(p) == "0" for p in found) else None
        )

    return wait_for(ready, f"the pods of {name}'s gang")


def test_a_prediction_made_before_the_budget_was_edited_is_void(
    plane: ControlPlane, ns: str, kubeconfig: Path
) -> None:
    metrics = RunMetrics()
    fit_job = kube_from(plane.kubeconfig, "scalerl-fit")
    spec = {
        "fit": {"everyEvaluations": 10_000, "minCompute": 0},
        "budget": {"maxComputeHours": BUDGET, "maxSteps": 100_000},
    }
    law = LAWS["r1"]
    with in_thread(plane, kubeconfig, [ns], metrics=metrics):
        create_run(plane, ns, run_manifest(ns, name="r3", **spec))
        gang = gang_up_of(plane, ns, "r3")
        set_running(plane, ns, gang)
        wait_for(lambda: phase_is(plane, ns, "Running", "r3"), "r3 Running")
        patch_run_status(plane, ns, {"evaluations": evaluations(law, 10)}, run="r3")
        made = fit_run(RunStatus(fit_job, ns, "r3"), bootstrap=40)
        assert made and made["budgetSet"] == {"maxSteps": 100_000, "maxComputeHours": BUDGET}
        # `kubectl edit`: the user doubles the budget; the run ends under the new one.
        patch_run(plane, ns, {"budget": {"maxComputeHours": 2 * BUDGET}}, run="r3")
        patch_run_status(plane, ns, {"evaluations": evaluations(law, EVALUATIONS)}, run="r3")
        set_phase(plane, ns, of_role(gang, "trainer"), "Succeeded", exit_code=0)
        wait_for(lambda: phase_is(plane, ns, "Succeeded", "r3"), "r3 Succeeded")

        def scored() -> dict[str, Any] | None:
            record = status(plane, ns, "r3").get("trackRecord") or {}
            return record if record.get("outcome") else None

        record = wait_for(scored, "r3 scored")

        def gauge(name: str) -> float | None:
            labels = {"seen": "0.5"}
            return metrics.registry.get_sample_value(f"scalerl_track_record_{name}", labels)

        wait_for(lambda: gauge("void") == 1, "r3 pooled as void")
    assert record["outcome"]["budgetSet"] == {"maxSteps": 100_000, "maxComputeHours": 2 * BUDGET}
    for row in record["predictions"]:
        assert row["void"] and row["error"] is None and row["inside"] is None
        assert "'maxComputeHours': 200" in row["voidReason"]
    assert gauge("coverage") is None and gauge("runs") == 1  # a void run is no hit and no miss
