"""A ScaleRLSweep on the real control plane: the operator creates a run per variant (at most
maxParallel live), stops the variant that cannot win (its pods go, its checkpoints stay: it is
suspended), reports the leader in `kubectl get srls`, and the sweep's
deletion takes its runs with it (they are its dependents)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from chart import in_thread
from controlplane import ControlPlane
from runs import (
    RUNS,
    ensure_crd,
    established,
    get_run,
    patch_run_status,
    phase_is,
    pods,
    requests,
    wait_for,
)
from small_run import run_manifest
from test_rbac import ON_SWEEP, used

from scalerl.metrics import RunMetrics
from scalerl.operator.names import LABEL_ROLE

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = "/apis/scalerl.dev/v1alpha1/namespaces"


def sweep_manifest(ns: str) -> dict[str, Any]:
    base = run_manifest(ns)["spec"]
    return {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLSweep",
        "metadata": {"name": "sw", "namespace": ns},
        "spec": {
            "base": base,
            "maxParallel": 2,
            "earlyStop": {"minPoints": 8},
            "variants": [
                {"name": "good"},
                {"name": "bad", "patch": {"recipe": {"optimizer": {"lr": 1.0e-9}}}},
                {"name": "third", "patch": {"seed": 3}},
            ],
        },
    }


def sweep_status(plane: ControlPlane, ns: str) -> dict[str, Any]:
    code, body = plane.api("GET", f"{SWEEPS}/{ns}/scalerlsweeps/sw")
    assert code == 200, body
    return dict(body.get("status") or {})


def gang(plane: ControlPlane, ns: str, run: str) -> list[dict[str, Any]]:
    """The run's trainer and generator pods (not its fit Jobs')."""
    return [p for p in pods(plane, ns, run=run) if p["metadata"]["labels"][LABEL_ROLE] != "fit"]


def prediction(A: float, lo: float, hi: float) -> dict[str, Any]:
    return {
        "A": A,
        "B": 1.5,
        "C_mid": 10.0,
        "R0": 0.1,
        "A_interval": [lo, hi],
        # What the early stop and the leaderboard read (scalerl.fit.decision.fit_bounds): the
        # forecast at the budget, here the asymptote's.
        "predictedAtBudget": A,
        "predictedAtBudgetInterval": [lo, hi],
        "points": 9,
        "confidence": "OK",
    }


def evaluations(A: float) -> list[dict[str, Any]]:
    return [
        {
            "step": 10 * i,
            "computeHours": 1.0 * i,
            "passRate": 0.1 + (A - 0.1) * i / (i + 3),
            "passRateSE": 0.01,
        }
        for i in range(10)
    ]


def test_a_sweep_runs_its_variants_stops_the_loser_and_reports_the_leader(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path
) -> None:
    ensure_crd(plane)
    plane.kubectl("apply", "--server-side", "-f", str(ROOT / "crds/scalerlsweeps.scalerl.dev.yaml"))
    established(plane, "scalerlsweeps.scalerl.dev")
    since = time.time()
    metrics = RunMetrics()

    def stopped(run: str) -> float | None:
        labels = {"namespace": ns, "run": run}
        return metrics.registry.get_sample_value("scalerl_sweep_variant_stopped", labels)

    # The sweep's periodic check every second; the runs' own stays off (their events drive
    # them).
    with in_thread(
        plane, operator_kubeconfig, namespaces=[], sweep_interval_s=1.0, metrics=metrics
    ):
        code, body = plane.api("POST", f"{SWEEPS}/{ns}/scalerlsweeps", sweep_manifest(ns))
        assert code == 201, body
        # maxParallel 2: the first two variants' runs, owned by the sweep; not the third yet.
        wait_for(lambda: get_run(plane, ns, "sw-bad"), "the second variant's run")
        good = get_run(plane, ns, "sw-good")
        assert good is not None
        assert good["metadata"]["ownerReferences"][0]["kind"] == "ScaleRLSweep"
        assert good["metadata"]["labels"]["scalerl.dev/variant"] == "good"
        bad = get_run(plane, ns, "sw-bad")
        assert bad is not None and bad["spec"]["recipe"]["optimizer"]["lr"] == 1.0e-9
        assert get_run(plane, ns, "sw-third") is None
        for run in ("sw-good", "sw-bad"):  # each run's gang, 3 pods
            wait_for(lambda run=run: len(gang(plane, ns, run)) == 3, f"{run}'s pods")

        # Their evaluations and fits, as the trainers and fit Jobs write them: bad measures
        # far below good and still rises, but its checked fit bounds A below good's.
        patch_run_status(
            plane,
            ns,
            {
                "evaluations": evaluations(0.8),
                "evaluationCount": 10,
                "prediction": prediction(0.8, 0.75, 0.85),
            },
            run="sw-good",
        )
        patch_run_status(
            plane,
            ns,
            {
                "evaluations": evaluations(0.3),
                "evaluationCount": 10,
                "prediction": prediction(0.3, 0.25, 0.35),
            },
            run="sw-bad",
        )
        wait_for(lambda: phase_is(plane, ns, "Suspended", run="sw-bad"), "the loser suspended")
        bad = get_run(plane, ns, "sw-bad")
        assert bad is not None
        notes = bad["metadata"]["annotations"]
        assert "below good's floor" in notes["scalerl.dev/stopped-by-sweep"]
        assert notes["scalerl.dev/stop-evidence"] == "fit"
        wait_for(lambda: gang(plane, ns, "sw-bad") == [], "the loser's pods gone")
        # What the dashboard's sweep row and ScaleRLSweepVariantStopped read.
        wait_for(lambda: stopped("sw-bad") == 1.0, "the loser's gauge")
        assert stopped("sw-good") == 0.0
        # Its slot is free: the third variant starts.
        wait_for(lambda: get_run(plane, ns, "sw-third"), "the third variant's run")
        wait_for(lambda: sweep_status(plane, ns).get("stopped") == 1, "the sweep's count")
        status = sweep_status(plane, ns)
        # The Leader is the leaderboard's first row: the fit of its evaluations it was ranked by.
        board = status["leaderboard"]
        assert status["leader"] == "good" and status["leaderA"] == board[0]["A"]
        assert [(r["name"], r["phase"]) for r in board][0] == ("good", "Running")
        assert ("bad", "Stopped") in [(r["name"], r["phase"]) for r in board]
        listed = plane.kubectl("get", "srls", "-n", ns)
        assert "good" in listed.splitlines()[1]

        deleted_at = time.monotonic()
        plane.kubectl("delete", "srls", "sw", "-n", ns, "--wait=false")
        wait_for(
            lambda: plane.api("GET", f"{SWEEPS}/{ns}/scalerlsweeps/sw")[0] == 404,
            "the sweep deleted (kopf lets it go once its periodic check stopped)",
        )
        wait_for(
            lambda: plane.api("GET", f"{RUNS}/{ns}/scalerlruns")[1]["items"] == [],
            "the sweep's runs deleted with it",
        )
        print(f"the sweep and its 3 runs deleted in {time.monotonic() - deleted_at:.1f} s")
    assert ON_SWEEP - {("scalerl.dev", "scalerlsweeps", "watch")} <= used(requests(plane, since))
