"""An evaluation with too many unscored samples is left out of the fit, with its reason, never
fitted silently: in fit.json (`leftOut`), in `scalerl fit FILE` (a curve file's `fit_excluded`
column), in the operator's fit of status.evaluations and in a sweep's leaderboard.

The check is against the fit of the same rows without the marked ones: a left-out point must
change nothing, however far off it lies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalerl.errors import FitError
from scalerl.fit import load_curve, sample_curve
from scalerl.fit.leaderboard import Evaluations
from scalerl.fit.report import fit_report, write_fit
from scalerl.operator.prediction import predict
from scalerl.spec import BudgetSpec
from scalerl.status.history import HistoryRow

REASON = "20 of 64 samples could not be scored (sandbox 20), more than 10 %"


def history(points: int = 14) -> list[dict[str, Any]]:
    compute = np.linspace(0.0, 3.0, points)
    rates = sample_curve(compute, 0.9, 2.0, 0.8, 0.15, noise=0.004, seed=1)
    return [
        {"step": 10 * i, "compute": float(c), "pass_rate": float(r), "pass_rate_se": 0.004}
        for i, (c, r) in enumerate(zip(compute, rates, strict=True))
    ]


def marked(rows: list[dict[str, Any]], at: list[int]) -> list[dict[str, Any]]:
    """`rows` with the evaluations at `at` read far too low and marked left out."""
    out = [dict(r) for r in rows]
    for i in at:
        out[i]["pass_rate"] = 0.01
        out[i]["fit_excluded"] = REASON
    return out


def budget() -> BudgetSpec:
    return BudgetSpec(max_steps=10_000, max_compute_hours=6.0)


OPTIONS: dict[str, Any] = {"min_compute": 0.0, "budget": budget(), "units": 1, "bootstrap": 50}


def test_history_names_the_mark_the_fit_reads() -> None:
    assert "fit_excluded" in HistoryRow.__dataclass_fields__


def test_a_marked_evaluation_changes_nothing_and_is_listed_with_its_reason() -> None:
    rows = history()
    clean = [r for i, r in enumerate(rows) if i not in (5, 9)]
    with_marks = fit_report(marked(rows, [5, 9]), **OPTIONS)
    without = fit_report(clean, **OPTIONS)
    assert with_marks.result.A == without.result.A
    assert with_marks.result.points == without.result.points
    assert with_marks.left_out == (
        {"step": 50, "compute": rows[5]["compute"], "reason": REASON},
        {"step": 90, "compute": rows[9]["compute"], "reason": REASON},
    )
    assert with_marks.to_dict()["leftOut"][0]["reason"] == REASON
    # Where the run stands is still its last evaluation, marked or not.
    last = fit_report(marked(rows, [13]), **OPTIONS)
    assert last.last_step == 130 and last.left_out[0]["step"] == 130


def test_fit_json_says_what_was_left_out(tmp_path: Path) -> None:
    report = write_fit(marked(history(), [4]), tmp_path, min_compute=0.0, budget=budget(), units=1)
    assert json.loads((tmp_path / "fit.json").read_text())["leftOut"] == report["leftOut"]
    assert [e["step"] for e in report["leftOut"]] == [40]


def test_a_run_whose_every_evaluation_is_marked_has_no_fit() -> None:
    with pytest.raises(FitError, match="all 14 evaluations are left out of the fit"):
        fit_report(marked(history(), list(range(14))), **OPTIONS)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_curve_file_carries_the_mark_to_scalerl_fit(tmp_path: Path, suffix: str) -> None:
    rows = marked(history(), [6])
    path = tmp_path / f"curve{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        names = ["step", "compute", "pass_rate", "pass_rate_se", "fit_excluded"]
        lines = [",".join(names)]
        lines += [",".join(f'"{r.get(n, "")}"' for n in names) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    curve = load_curve(path)
    assert [r.get("fit_excluded") for r in curve.rows()] == [None] * 6 + [REASON] + [None] * 7
    fitted = fit_report(curve.rows(), **OPTIONS)
    assert [e["step"] for e in fitted.left_out] == [60]


def test_scalerl_fit_says_which_evaluations_it_left_out_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scalerl.cli import main

    path = tmp_path / "curve.jsonl"  # a history.jsonl would be checked as a run's (conftest)
    path.write_text("".join(json.dumps(r) + "\n" for r in marked(history(), [6])))
    assert main(["fit", str(path), "--bootstrap", "0"]) == 0
    said = capsys.readouterr().out
    assert f"  left out: step 60 at compute {history()[6]['compute']:.4g}: {REASON}" in said
    assert main(["fit", str(path), "--bootstrap", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["leftOut"][0]["reason"] == REASON


def test_a_mark_that_is_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "curve.jsonl"
    path.write_text(json.dumps({"compute": 0.0, "pass_rate": 0.2, "fit_excluded": 3}) + "\n")
    with pytest.raises(Exception, match="fit_excluded.*not text"):
        load_curve(path)


def test_the_operators_fit_and_the_leaderboard_leave_it_out_too() -> None:
    rows = marked(history(), [7])
    status = [
        {
            "step": r["step"],
            "computeHours": r["compute"],
            "passRate": r["pass_rate"],
            "passRateSE": r["pass_rate_se"],
            **({"fitExcluded": r["fit_excluded"]} if "fit_excluded" in r else {}),
        }
        for r in rows
    ]
    clean = [s for s in status if "fitExcluded" not in s]
    assert predict(status, **OPTIONS)["A"] == predict(clean, **OPTIONS)["A"]
    board = Evaluations.from_rows(
        status,
        compute="computeHours",
        pass_rate="passRate",
        se="passRateSE",
        excluded="fitExcluded",
    )
    assert len(board) == 13 and 0.01 not in board.pass_rate
