"""What the operator does for a ScaleRLSweep, on run objects as the API server holds them: the
leaderboard is the local `scalerl sweep`'s (one function, one row format), the Leader its first
row; the early stop reads status.evaluations; a variant its user resumed is running again."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scalerl.fit import fit_curve
from scalerl.fit.law import sigmoid
from scalerl.operator import sweeps
from scalerl.spec import merge_patch, parse_sweep
from scalerl.sweep import Variant, write_leaderboard

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())
EXAMPLE["metadata"]["namespace"] = "ns"
SWEEP = parse_sweep(EXAMPLE)
RUNS = SWEEP.variant_runs()
CURVES = {  # the example's variants: two good recipes and a flat one (lr 1e-8)
    "pipelinerl-8": (0.75, 1.2, 0.03),
    "ppo-off-policy-1": (0.80, 1.0, 0.04),
    "crippled-lr": (0.20, 1.0, 0.03),
}


def history(variant: str, evaluations: int = 11, seed: int = 0) -> list[dict[str, Any]]:
    """Evaluations every 5 steps, 128 prompts x 8 samples each (binomial), as history rows."""
    A, B, c_mid = CURVES[variant]
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(evaluations):
        step = 5 * i
        compute = step * 0.001
        p = float(sigmoid(compute, A, B, c_mid, 0.2)) if A > 0.2 else 0.2
        means = rng.binomial(8, p, size=128) / 8
        se = float(means.std(ddof=1) / np.sqrt(128))
        correct = int(round(means.sum() * 8))
        rows.append(
            {
                "step": step,
                "compute": compute,
                "pass_rate": correct / 1024,
                "pass_rate_se": se,
                "eval_samples": 1024,
                "eval_correct": correct,
            }
        )
    return rows


def run_object(variant: str, rows: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    """The variant's run as the operator created it, with the status its trainer reports."""
    obj = sweeps.run_object(
        {"metadata": {"name": "demo-sweep", "namespace": "ns", "uid": "u"}}, variant, RUNS[variant]
    )
    evaluations = [
        {
            "step": r["step"],
            "computeHours": r["compute"],
            "passRate": r["pass_rate"],
            "passRateSE": r["pass_rate_se"],
        }
        for r in rows
    ]
    obj["status"] = {"phase": "Running", "evaluations": evaluations, **status}
    return obj


# The fit Job's last prediction, one refresh behind and made differently: the board must not
# show it as the ranked fit (the audit's F1).
STALE = {
    "A": 0.5,
    "A_interval": [0.45, 0.55],
    "B": 9.0,
    "C_mid": 1.0,
    "points": 4,
    "confidence": "OK",
}


def test_cluster_and_local_rank_the_same_histories_alike(tmp_path: Path) -> None:
    histories = {v: history(v, seed=i) for i, v in enumerate(CURVES)}
    existing = {v: run_object(v, rows, prediction=STALE) for v, rows in histories.items()}
    cluster = sweeps.leaderboard(SWEEP, RUNS, existing)
    local = []
    for v, rows in histories.items():
        variant = Variant(v, RUNS[v], tmp_path / v, phase="Running")
        variant.out.mkdir()
        (variant.out / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (variant.out / "fit.json").write_text(json.dumps(STALE))
        local.append(variant)
    assert cluster == write_leaderboard(local, tmp_path)
    # The Leader is the first row, and shows the weighted fit of its evaluations, by hand.
    status = sweeps.summary(SWEEP, cluster)
    leader = histories[status["leader"]]
    by_hand = fit_curve(
        [r["compute"] for r in leader],
        [r["pass_rate"] for r in leader],
        min_compute=0.0,
        sigma=[r["pass_rate_se"] for r in leader],
    )
    assert status["leader"] == cluster[0]["name"] and status["leaderA"] == by_hand.A


def test_the_early_stop_reads_the_runs_evaluations_when_the_good_fits_are_misfit() -> None:
    misfit = {**STALE, "confidence": "Misfit", "points": 10}
    existing = {
        v: run_object(v, history(v, seed=i), prediction=misfit) for i, v in enumerate(CURVES)
    }
    (stopped,) = sweeps.stop_losers(SWEEP, RUNS, existing).items()
    assert stopped[0] == "crippled-lr" and stopped[1].evidence == "measured"


class Cluster:
    """Just enough of the API server for a sweep's check: objects by (kind, name), merge
    patches as it applies them."""

    def __init__(self, sweep: dict[str, Any], runs: list[dict[str, Any]]) -> None:
        self.objects = {("ScaleRLSweep", "demo-sweep"): sweep}
        self.objects |= {("ScaleRLRun", r["metadata"]["name"]): r for r in runs}

    def find(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    def list(self, api_version: str, kind: str, ns: str, labels: dict[str, str]) -> list[Any]:
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj
        return copy.deepcopy(obj)

    def patch(self, api_version: str, kind: str, ns: str, name: str, body: Any, **_: Any) -> Any:
        patched = merge_patch(self.objects[(kind, name)], body)
        self.objects[(kind, name)] = patched
        return copy.deepcopy(patched)


def check(cluster: Cluster) -> dict[str, Any]:
    sweep_obj = cluster.objects[("ScaleRLSweep", "demo-sweep")]
    sweep_obj["metadata"]["uid"] = "u"
    ctx = sweeps.SweepContext(cluster, "ns", "demo-sweep", lambda *_: None)  # type: ignore[arg-type]
    sweeps.reconcile(ctx)
    return dict(cluster.objects[("ScaleRLSweep", "demo-sweep")].get("status") or {})


def stopped_gauge(run: dict[str, Any]) -> float | None:
    """scalerl_sweep_variant_stopped as the operator exports it from the run object."""
    from scalerl.metrics import RunMetrics
    from scalerl.operator.handlers import export_metrics

    metrics = RunMetrics()
    export_metrics(metrics, run, deleted=False)
    labels = {"namespace": "ns", "run": run["metadata"]["name"]}
    return metrics.registry.get_sample_value("scalerl_sweep_variant_stopped", labels)


def test_a_stopped_variant_its_user_resumed_runs_again_and_is_not_stopped_twice() -> None:
    misfit = {**STALE, "confidence": "Misfit", "points": 10}
    runs = [run_object(v, history(v, seed=i), prediction=misfit) for i, v in enumerate(CURVES)]
    cluster = Cluster(copy.deepcopy(EXAMPLE), runs)
    status = check(cluster)
    crippled = cluster.objects[("ScaleRLRun", "demo-sweep-crippled-lr")]
    assert crippled["spec"]["suspend"] is True
    assert crippled["metadata"]["annotations"][sweeps.STOP_EVIDENCE] == "measured"
    assert (status["stopped"], status["running"]) == (1, 2)
    row = next(r for r in status["leaderboard"] if r["name"] == "crippled-lr")
    # Stopped after its evaluation at step 50 (0.05): 60 steps at that pace end at 0.06.
    assert row["phase"] == "Stopped" and abs(row["computeSaved"] - 0.01) < 1e-12
    # Its user resumes it: it runs again, counts as running, and the sweep leaves it be.
    assert stopped_gauge(crippled) == 1.0
    crippled["spec"]["suspend"] = False
    status = check(cluster)
    crippled = cluster.objects[("ScaleRLRun", "demo-sweep-crippled-lr")]
    assert sweeps.STOPPED_BY not in crippled["metadata"]["annotations"]
    assert stopped_gauge(crippled) == 0.0  # ScaleRLSweepVariantStopped no longer fires
    assert crippled["metadata"]["annotations"][sweeps.RESUMED] == "true"
    assert crippled["spec"]["suspend"] is False
    assert (status["stopped"], status["running"], status["phase"]) == (0, 3, "Running")


def test_a_sweep_whose_every_variant_failed_failed() -> None:
    runs = [run_object(v, history(v, evaluations=3), phase="Failed") for v in CURVES]
    status = check(Cluster(copy.deepcopy(EXAMPLE), runs))
    assert status["phase"] == "Failed" and status.get("leader") is None
    done = [run_object(v, history(v), phase="Succeeded") for v in CURVES]
    assert check(Cluster(copy.deepcopy(EXAMPLE), done))["phase"] == "Succeeded"
