"""The fit of a run in progress: `fit.json` and `curve.png` next to its `history.jsonl`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.errors import ScaleRLError
from scalerl.fit.fitter import fit_curve
from scalerl.fit.outlook import outlook
from scalerl.fit.plot import plot_fit
from scalerl.fit.points import standard_errors
from scalerl.spec import BudgetSpec

FIT_FILE = "fit.json"
PLOT_FILE = "curve.png"
BACKTEST_MIN_EVALUATIONS = 8


def write_fit(
    history: list[dict[str, Any]],
    out: Path,
    *,
    min_compute: float | None,
    budget: BudgetSpec,
    units: int,
) -> dict[str, Any]:
    """Fit the evaluations so far; write fit.json and curve.png in `out`; return fit.json's data:
    the fit, and the run's outlook (`scalerl.fit.outlook`: predictedAtBudget and what an
    evaluation there will read, computeToTarget, etaSeconds at `units` compute per hour,
    confidence), the evaluation noise taken from the last evaluation's `pass_rate_se`."""
    compute = np.array([e["compute"] for e in history], dtype=float)
    pass_rate = np.array([e["pass_rate"] for e in history], dtype=float)
    sigma = standard_errors(history, "pass_rate_se")
    result = fit_curve(compute, pass_rate, min_compute=min_compute, sigma=sigma)
    end = outlook(
        result,
        budget,
        step=int(history[-1]["step"]),
        compute=float(compute[-1]),
        units=units,
        observation_se=float(history[-1].get("pass_rate_se") or 0.0),
    )
    report = {
        **result.to_dict(),
        **end,
        "evaluations": len(history),
        "lastStep": history[-1].get("step"),
        "backtest": backtest(compute, pass_rate, min_compute, sigma),
    }
    tmp = out / (FIT_FILE + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out / FIT_FILE)
    plot_fit(result, compute, pass_rate, out / PLOT_FILE, predict_to=end["budget"])
    return report


def backtest(
    compute: np.ndarray,
    pass_rate: np.ndarray,
    min_compute: float | None,
    sigma: list[float] | None = None,
) -> dict[str, float] | None:
    """How well the first half of the evaluations predicts the last one: the trust to put in an
    extrapolation from this run. None until there are 8 evaluations."""
    if len(compute) < BACKTEST_MIN_EVALUATIONS:
        return None
    half = len(compute) // 2
    try:
        early = fit_curve(
            compute[:half],
            pass_rate[:half],
            min_compute=min_compute,
            bootstrap=0,
            sigma=None if sigma is None else sigma[:half],
        )
    except ScaleRLError:
        return None
    predicted = early.predict(float(compute[-1]))
    return {
        "fittedOn": half,
        "compute": float(compute[-1]),
        "predicted": predicted,
        "actual": float(pass_rate[-1]),
        "error": predicted - float(pass_rate[-1]),
    }
