"""A run's fit report: fit.json (with the half-run backtest) and curve.png beside its history."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from scalerl.fit import fit_curve, sample_curve, sigmoid
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
    # 18 evaluations from compute 0 to 3: the first half (compute <= 1.5) holds the step-0 one
    # and 8 trained ones, as many as the half-run check needs.
    report = write_fit(history(18), tmp_path, min_compute=0.0, budget=budget(), units=1)
    on_disk = json.loads((tmp_path / "fit.json").read_text())
    assert on_disk == report
    assert abs(report["A"] - 0.9) < 0.03
    assert abs(report["predictedAtBudget"] - sigmoid(6.0, 0.9, 2.0, 0.8, 0.15)) < 0.03
    assert (report["budget"], report["budgetLimit"]) == (6.0, "maxComputeHours")
    backtest = report["backtest"]
    assert backtest["fittedOn"] == 9 and backtest["compute"] == 3.0
    assert abs(backtest["error"]) < 0.03
    # The run follows the law: its last evaluation lies where its first half said.
    assert backtest["inside"] is True and report["confidence"] == "OK"
    assert report["confidenceReason"] is None
    assert report["points"] == 17  # trained evaluations: the step-0 one is not one
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
    # evaluation's standard error wide, and about that where the fit is tight ...
    rows = history(40, se=0.02)
    report = write_fit(rows, tmp_path, min_compute=0.0, budget=budget(), units=1)
    lo, hi = report["predictedAtBudgetInterval"]
    z = statistics.NormalDist().inv_cdf(0.975)
    assert lo < report["predictedAtBudget"] < hi
    assert 2 * z * 0.02 * 0.95 <= hi - lo
    law = fit_curve(
        [r["compute"] for r in rows], [r["pass_rate"] for r in rows],
        sigma=[0.02] * 40, min_compute=0.0,
    )  # fmt: skip
    law_lo, law_hi = dataclasses.replace(law, drift_probe=None).predictive_interval(6.0)
    assert law_hi - law_lo <= 2 * z * 0.02 * 1.6
    # ... the law's alone, or wider: beyond the data the forecast takes the run's drift only as
    # far as its own earlier fits missed beyond their intervals (scalerl.fit.drift), which on a
    # run drawn from the law is not far.
    drift = report["drift"]
    assert drift is not None and drift["origins"] >= 2
    assert report["forecast"]["evidence"]["compared"] > 0
    assert hi - lo >= law_hi - law_lo - 1e-9
    # Where the evaluations say nothing of their noise, the fit's residuals tell it.
    quiet = [{k: v for k, v in row.items() if k != "pass_rate_se"} for row in history(16)]
    report = write_fit(quiet, tmp_path, min_compute=0.0, budget=budget(), units=1)
    lo, hi = report["predictedAtBudgetInterval"]
    residual_se = math.sqrt(report["sse"] / (16 - 3))
    assert lo < report["predictedAtBudget"] < hi
    assert hi - lo >= 2 * z * residual_se * 0.9


def test_backtest_waits_for_eight_evaluations(tmp_path: Path) -> None:
    assert (
        write_fit(history(6), tmp_path, min_compute=0.0, budget=budget(), units=1)["backtest"]
        is None
    )


def demo_history(every: int, steps: int = 100, last: float = 0.071) -> list[dict[str, float]]:
    """`make demo`'s layout: an evaluation every `every` of `steps` steps, compute linear in
    steps up to `last`, 128 prompts x 8 samples of a rising curve."""
    rng = np.random.default_rng(1)
    rows = []
    for step in range(0, steps + 1, every):
        c = last * step / steps
        means = rng.binomial(8, float(sigmoid(c, 0.95, 1.7, 0.024, 0.18)), size=128) / 8
        se = float(means.std(ddof=1) / math.sqrt(128))
        rows.append({"step": step, "compute": c, "pass_rate": float(means.mean()),
                     "pass_rate_se": se, "time": 1000.0 + 40.0 * step})  # fmt: skip
    return rows


def test_an_unchecked_fit_says_so_and_why(tmp_path: Path) -> None:
    # The demo as it was (every 10 of 100 steps): 11 evaluations, so the first half of the
    # compute (steps 0-50) holds 5 trained ones, too few for the half-run check. The fit has 10
    # points, enough not to be TooEarly: it was "OK" without a check.
    rows = demo_history(every=10)
    report = write_fit(rows, tmp_path, min_compute=0.0, budget=budget(100, 0.5), units=3)
    assert report["points"] == 10 and report["backtest"] is None
    assert report["confidence"] == "Unchecked"
    first_half = [r for r in rows if 0 < r["compute"] <= rows[-1]["compute"] / 2]
    assert len(first_half) == 5
    assert report["confidenceReason"] == (
        "the half-run check needs 8 evaluations past the floor in the first half of the "
        "compute; it has 5"
    )


def test_the_demo_evaluating_every_5_steps_gets_its_check(tmp_path: Path) -> None:
    # 21 evaluations: the first half holds 10 trained ones, and the check runs.
    report = write_fit(demo_history(every=5), tmp_path, min_compute=0.0, budget=budget(100, 0.5),
                       units=3)  # fmt: skip
    assert report["backtest"] is not None and report["backtest"]["fittedOn"] == 11
    assert report["confidence"] in ("OK", "Misfit")
    assert report["confidence"] == ("OK" if report["backtest"]["inside"] else "Misfit")


def test_eta_is_wall_seconds_at_the_run_s_measured_pace(tmp_path: Path) -> None:
    # 40 wall seconds per step, compute 0.071 / 100 per step: 40 / 0.00071 s per unit of
    # compute; the run is at step 100 of maxSteps 200, so 100 steps (4000 s) are left.
    rows = demo_history(every=10)
    report = write_fit(rows, tmp_path, min_compute=0.0, budget=budget(200, 0.5), units=3)
    assert report["budget"] == pytest.approx(0.142)
    assert report["etaSeconds"]["budget"] == pytest.approx(4000.0)
    # Without times, training seconds at 3 processes: 0.071 compute-hours left / 3 per hour.
    untimed = [{k: v for k, v in r.items() if k != "time"} for r in rows]
    report = write_fit(untimed, tmp_path, min_compute=0.0, budget=budget(200, 0.5), units=3)
    assert report["etaSeconds"]["budget"] == pytest.approx(0.071 / 3 * 3600)


def test_f6_fit_json_voids_a_prediction_for_another_budget_and_keeps_a_stopped_run_censored(
    tmp_path: Path,
) -> None:
    # A run's fits along the way under maxComputeHours 6, its budget then raised to 12 (a local
    # run resumed with a new spec) before it ends: the earlier prediction aimed elsewhere.
    rows = history(18, se=0.01)
    early = tmp_path / "raised"
    early.mkdir()
    write_fit(rows[:14], early, min_compute=0.0, budget=budget(), units=1)
    end = write_fit(rows, early, min_compute=0.0, budget=budget(max_compute_hours=12.0), units=1,
                    ended=True)  # fmt: skip
    made_for_6, made_for_12 = end["trackRecord"]
    assert made_for_6["budgetSet"] == {"maxSteps": 10_000, "maxComputeHours": 6.0}
    assert made_for_6["void"] and made_for_6["inside"] is None and made_for_6["error"] is None
    assert not made_for_12["void"] and made_for_12["inside"] is not None
    # A run its prediction stopped: every prediction kept, censored, with what it read then.
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    write_fit(rows[:14], stopped, min_compute=0.0, budget=budget(), units=1)
    last = write_fit(rows[:16], stopped, min_compute=0.0, budget=budget(), units=1,
                     stopped="the forecast at the budget lies below 0.95")  # fmt: skip
    assert len(last["trackRecord"]) == 2
    for row in last["trackRecord"]:
        assert row["censored"] and row["inside"] is None
        assert row["actual"] == pytest.approx(rows[15]["pass_rate"])
        assert "stopped by its prediction" in row["censoredReason"]
