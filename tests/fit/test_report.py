"""A run's fit report: fit.json (with the half-run backtest) and curve.png beside its history."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from scalerl.fit import sample_curve, sigmoid
from scalerl.fit.report import write_fit
from scalerl.spec import BudgetSpec


def history(points: int, se: float = 0.004) -> list[dict[str, float]]:
    compute = np.linspace(0.0, 3.0, points)
    rates = sample_curve(compute, 0.9, 2.0, 0.8, 0.15, noise=se, seed=1)
    return [
        {"step": 10 * i, "compute": c, "pass_rate": r, "pass_rate_se": se}
        for i, (c, r) in enumerate(zip(compute, rates, strict=True))
    ]


def budget(max_steps: int = 10_000, max_compute_hours: float = 6.0) -> BudgetSpec:
    return BudgetSpec(max_steps=max_steps, max_compute_hours=max_compute_hours)


def test_write_fit_reports_prediction_backtest_and_plot(tmp_path: Path) -> None:
    report = write_fit(history(16), tmp_path, min_compute=0.0, budget=budget(), units=1)
    on_disk = json.loads((tmp_path / "fit.json").read_text())
    assert on_disk == report
    assert abs(report["A"] - 0.9) < 0.03
    assert abs(report["predictedAtBudget"] - sigmoid(6.0, 0.9, 2.0, 0.8, 0.15)) < 0.03
    assert (report["budget"], report["budgetLimit"]) == (6.0, "maxComputeHours")
    backtest = report["backtest"]
    assert backtest["fittedOn"] == 8 and backtest["compute"] == 3.0
    assert abs(backtest["error"]) < 0.03
    # The run follows the law: its last evaluation lies where its first half said.
    assert backtest["inside"] is True and report["confidence"] == "OK"
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_prediction_is_where_the_run_will_end_when_max_steps_comes_first(
    tmp_path: Path,
) -> None:
    # 150 steps took compute 3.0: 0.02 per step, so maxSteps 200 ends the run at compute 4.0,
    # before the compute budget of 6.0.
    report = write_fit(
        history(16), tmp_path, min_compute=0.0, budget=budget(max_steps=200), units=1
    )
    assert report["budgetLimit"] == "maxSteps"
    assert report["budget"] == 3.0 / 150 * 200
    assert abs(report["predictedAtBudget"] - sigmoid(4.0, 0.9, 2.0, 0.8, 0.15)) < 0.03


def test_the_interval_at_the_end_is_for_what_an_evaluation_there_will_read(
    tmp_path: Path,
) -> None:
    # The curve's band and one evaluation's noise: at least the normal quantiles of the last
    # evaluation's standard error wide, and about that where the fit is tight.
    report = write_fit(history(40, se=0.02), tmp_path, min_compute=0.0, budget=budget(), units=1)
    lo, hi = report["predictedAtBudgetInterval"]
    z = statistics.NormalDist().inv_cdf(0.975)
    assert lo < report["predictedAtBudget"] < hi
    assert 2 * z * 0.02 * 0.95 <= hi - lo <= 2 * z * 0.02 * 1.6
    # Where the evaluations say nothing of their noise, the interval is the curve's band.
    quiet = [{k: v for k, v in row.items() if k != "pass_rate_se"} for row in history(16)]
    report = write_fit(quiet, tmp_path, min_compute=0.0, budget=budget(), units=1)
    lo, hi = report["predictedAtBudgetInterval"]
    assert hi - lo < 2 * z * 0.004


def test_backtest_waits_for_eight_evaluations(tmp_path: Path) -> None:
    assert (
        write_fit(history(6), tmp_path, min_compute=0.0, budget=budget(), units=1)["backtest"]
        is None
    )
