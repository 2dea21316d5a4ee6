"""The fit of a run in progress: `fit.json` and `curve.png` next to its `history.jsonl`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.fit.backtest import backtest
from scalerl.fit.fitter import fit_curve
from scalerl.fit.outlook import outlook
from scalerl.fit.plot import plot_fit
from scalerl.fit.points import standard_errors
from scalerl.spec import BudgetSpec

FIT_FILE = "fit.json"
PLOT_FILE = "curve.png"


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
    confidence and the half-run backtest it rests on), the evaluation noise taken from the last
    evaluation's `pass_rate_se`."""
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
        backtest=backtest(compute, pass_rate, sigma=sigma, min_compute=min_compute),
    )
    report = {
        **result.to_dict(),
        **end,
        "evaluations": len(history),
        "lastStep": history[-1].get("step"),
    }
    tmp = out / (FIT_FILE + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out / FIT_FILE)
    plot_fit(result, compute, pass_rate, out / PLOT_FILE, predict_to=end["budget"])
    return report
