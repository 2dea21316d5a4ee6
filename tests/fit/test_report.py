"""A run's fit report: fit.json (with the half-run backtest) and curve.png beside its history."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scalerl.fit import sample_curve, sigmoid
from scalerl.fit.report import write_fit


def history(points: int) -> list[dict[str, float]]:
    compute = np.linspace(0.0, 3.0, points)
    rates = sample_curve(compute, 0.9, 2.0, 0.8, 0.15, noise=0.004, seed=1)
    return [
        {"step": 10 * i, "compute": c, "pass_rate": r}
        for i, (c, r) in enumerate(zip(compute, rates, strict=True))
    ]


def test_write_fit_reports_prediction_backtest_and_plot(tmp_path: Path) -> None:
    report = write_fit(history(16), tmp_path, min_compute=0.0, budget=6.0)
    on_disk = json.loads((tmp_path / "fit.json").read_text())
    assert on_disk == report
    assert abs(report["A"] - 0.9) < 0.03
    assert abs(report["predictedAtBudget"] - sigmoid(6.0, 0.9, 2.0, 0.8, 0.15)) < 0.03
    backtest = report["backtest"]
    assert backtest["fittedOn"] == 8 and backtest["compute"] == 3.0
    assert abs(backtest["error"]) < 0.03
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_backtest_waits_for_eight_evaluations(tmp_path: Path) -> None:
    assert write_fit(history(6), tmp_path, min_compute=0.0, budget=6.0)["backtest"] is None
