"""The fit of a run's evaluations and its outlook: `fit_report`, the one computation behind
`fit.json` (with `curve.png`, next to a run's `history.jsonl`), `status.prediction` on a cluster
and `scalerl fit FILE --json`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.errors import FitError
from scalerl.fit.backtest import backtest
from scalerl.fit.domains import a_by_domain, as_dicts, draw_domains, fit_domains
from scalerl.fit.fitter import fit_curve
from scalerl.fit.outlook import FitReport, outlook, seconds_per_compute, unchecked_reason
from scalerl.fit.plot import figure_of_fit, plot_fit
from scalerl.fit.points import HISTORY, Columns, standard_errors
from scalerl.fit.track import Outcome, keep, kept_prediction, score
from scalerl.spec import BudgetSpec

FIT_FILE = "fit.json"
PLOT_FILE = "curve.png"


def split_excluded(
    rows: Sequence[Mapping[str, Any]], columns: Columns
) -> tuple[list[Mapping[str, Any]], list[dict[str, Any]]]:
    """The rows the fit uses, and those it leaves out ({step, compute, reason}): an evaluation
    marked with a reason (`columns.excluded`: too many of its samples could not be scored)."""
    kept: list[Mapping[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    for row in rows:
        reason = row.get(columns.excluded) if columns.excluded else None
        if not reason:
            kept.append(row)
            continue
        step = row.get("step")
        left_out.append(
            {
                "step": None if step is None else int(step),
                "compute": float(row[columns.compute]),
                "reason": str(reason),
            }
        )
    return kept, left_out


def fit_report(
    rows: Sequence[Mapping[str, Any]],
    *,
    min_compute: float | None,
    budget: BudgetSpec,
    units: int | None,
    columns: Columns = HISTORY,
    **fit_options: Any,
) -> FitReport:
    """Fit `rows` (evaluations sorted by compute; names per `columns`), weighted by their
    standard errors when every row has one, and the outlook of a run that has come as far as
    the last row: predictedAtBudget and what an evaluation there will read, computeToTarget,
    etaSeconds (wall seconds at the pace the rows' times show; without times, training seconds
    at `units` compute per hour; null without either), confidence and the half-run backtest it
    rests on. `fit_options` go to `fit_curve` (and the backtest's fit). Raises what `fit_curve`
    raises.

    An evaluation marked as left out (`columns.excluded`, with its reason: too many of its
    samples could not be scored) is not fitted; the report lists it (`left_out`). The run's
    place (its last step and compute, its wall pace) is still read from every row."""
    fitted, left_out = split_excluded(rows, columns)
    if not fitted:
        raise FitError(
            f"all {len(rows)} evaluations are left out of the fit; the last: "
            f"{left_out[-1]['reason']}"
        )
    compute = np.array([float(r[columns.compute]) for r in fitted], dtype=float)
    pass_rate = np.array([float(r[columns.pass_rate]) for r in fitted], dtype=float)
    every = [float(r[columns.compute]) for r in rows]
    sigma = standard_errors(fitted, columns.se)
    result = fit_curve(compute, pass_rate, min_compute=min_compute, sigma=sigma, **fit_options)
    check = backtest(compute, pass_rate, sigma=sigma, min_compute=min_compute, **fit_options)
    step = rows[-1].get("step")
    end = outlook(
        result,
        budget,
        step=int(step or 0),
        compute=every[-1],
        units=units,
        backtest=check,
        unchecked="" if check else unchecked_reason(compute, min_compute),
        wall_per_compute=seconds_per_compute([_time(r, columns) for r in rows], every),
    )
    last = None if step is None else int(step)
    return FitReport(result, end, len(rows), last, tuple(left_out))


def _time(row: Mapping[str, Any], columns: Columns) -> float | None:
    value = row.get(columns.time)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def write_fit(
    history: list[dict[str, Any]],
    out: Path,
    *,
    min_compute: float | None,
    budget: BudgetSpec,
    units: int,
    ended: bool = False,
    stopped: str | None = None,
) -> dict[str, Any]:
    """Fit the evaluations so far (`fit_report`); write fit.json and curve.png in `out`; return
    fit.json's data: the fit and the run's outlook, and its `track` (`scalerl.fit.track`): the
    predictions kept so far, this one added, and once the run has `ended`, `trackRecord`: each
    scored against the last evaluation, under the budget it ended with (`budget`); a run
    `stopped` by its prediction (the reason) has its predictions kept as censored."""
    options: dict[str, Any] = {"min_compute": min_compute, "budget": budget, "units": units}
    fitted = fit_report(history, **options)
    report = fitted.to_dict()
    domains = fit_domains(history, fit_report, HISTORY, **options)
    if domains:  # a run of several domains: one fit each (scalerl.fit.domains)
        report["domains"] = as_dicts(domains)
        report["A_byDomain"] = a_by_domain(report["domains"])
    report.update(_track(out, report, history, ended=ended, stopped=stopped))
    tmp = out / (FIT_FILE + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out / FIT_FILE)
    fitted_rows, _ = split_excluded(history, HISTORY)  # a point left out is not drawn as fitted
    compute = np.array([e["compute"] for e in fitted_rows], dtype=float)
    pass_rate = np.array([e["pass_rate"] for e in fitted_rows], dtype=float)
    if not domains:
        plot_fit(fitted.result, compute, pass_rate, out / PLOT_FILE, predict_to=report["budget"])
        return report
    fig = figure_of_fit(fitted.result, compute, pass_rate, report["budget"])
    draw_domains(fig, domains, history, HISTORY)
    fig.savefig(out / PLOT_FILE, format="png", dpi=110)
    return report


def _track(
    out: Path,
    report: dict[str, Any],
    history: list[dict[str, Any]],
    *,
    ended: bool,
    stopped: str | None = None,
) -> dict[str, Any]:
    """fit.json's `track` (the previous fit.json's, with this fit's prediction kept) and, once
    the run has ended (or was `stopped` by its prediction), its `trackRecord`."""
    last = history[-1]
    kept = kept_prediction(report, compute=float(last["compute"]), step=int(last["step"]))
    track = keep(_previous_track(out / FIT_FILE), kept)
    if not ended and stopped is None:
        return {"track": track}
    outcome = Outcome(
        pass_rate=float(last["pass_rate"]),
        compute=float(last["compute"]),
        budget_set=report.get("budgetSet"),
        stopped=stopped,
    )
    return {"track": track, "trackRecord": score(track, outcome)}


def _previous_track(path: Path) -> list[dict[str, Any]]:
    """The track of the fit.json in place; none where there is none (the first fit), or it is
    unreadable (a folder's fit.json from before tracks were kept: the track starts afresh)."""
    try:
        track = json.loads(path.read_text()).get("track")
    except (OSError, ValueError, AttributeError):
        return []
    return list(track) if isinstance(track, list) else []
