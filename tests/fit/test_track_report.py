"""`scalerl track-record DIR...` on finished local runs: every fit a run made is kept in its
fit.json (write_fit, called at growing prefixes of the history as the runner does), scored when the
run ends, and pooled across runs by fraction of the run seen. The errors it reports are recomputed
here from the histories alone: the fit of each prefix, the law at the budget, the last reading."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalerl.cli import main
from scalerl.fit import fit_curve, sample_curve
from scalerl.fit.report import write_fit
from scalerl.spec import BudgetSpec

MAX_STEPS, STEP_COMPUTE, SE = 200, 0.02, 0.01
BUDGET = BudgetSpec(max_steps=MAX_STEPS, max_compute_hours=1000.0)  # maxSteps ends each run
# A fit after evaluations 5, 6, 9, ... of 21 (one every 10 steps from step 0): 20, 25, 40, 45, 70
# and 100 % of the run seen: two by each of 25 (one on its edge) and 50 %.
PREFIXES = (5, 6, 9, 10, 15, 21)
LAWS = {"a": (0.8, 2.0, 1.5, 0.2, 1), "b": (0.6, 1.5, 3.0, 0.1, 2), "c": (0.9, 1.2, 2.0, 0.3, 3)}


def history(A: float, B: float, C_mid: float, R0: float, seed: int) -> list[dict[str, Any]]:
    steps = np.arange(0, MAX_STEPS + 1, 10)
    compute = STEP_COMPUTE * steps
    rates = sample_curve(compute, A, B, C_mid, R0, noise=SE, seed=seed)
    return [
        {"step": int(s), "compute": float(c), "pass_rate": float(r), "pass_rate_se": SE}
        for s, c, r in zip(steps, compute, rates, strict=True)
    ]


def finished_run(out: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run folder as the local runner leaves it; the fit.json of each fit as it was written."""
    out.mkdir()
    written = []
    for n in PREFIXES:
        write_fit(rows[:n], out, min_compute=0.0, budget=BUDGET, units=1, ended=n == len(rows))
        written.append(json.loads((out / "fit.json").read_text()))
    return written


def expected_errors(rows: list[dict[str, Any]]) -> dict[float, float]:
    """From the history alone: per fraction seen, the error of the last fit made by then."""
    last = rows[-1]["pass_rate"]
    out = {}
    for n in PREFIXES:
        c = np.array([r["compute"] for r in rows[:n]])
        y = np.array([r["pass_rate"] for r in rows[:n]])
        fit = fit_curve(c, y, min_compute=0.0, sigma=[SE] * n)
        end = c[-1] / rows[n - 1]["step"] * MAX_STEPS  # the maxSteps budget at the pace so far
        for seen in (0.25, 0.5, 0.75):
            if c[-1] / end <= seen:
                # The forecast: the law moved by the run's drift (fit.json's predictedAtBudget).
                out[seen] = fit.forecast(end) - last  # later fits overwrite: the latest by then
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("runs")
    out: dict[str, Any] = {}
    for name, law in LAWS.items():
        rows = history(*law)
        out[name] = (base / name, rows, finished_run(base / name, rows))
    return out


def test_each_fit_json_keeps_every_prediction_and_the_last_scores_them(runs: Any) -> None:
    folder, rows, written = runs["a"]
    assert [len(w["track"]) for w in written] == list(range(1, len(PREFIXES) + 1))
    assert all("trackRecord" not in w for w in written[:-1])
    final = written[-1]
    for kept, at_the_time in zip(final["track"], written, strict=True):
        assert kept["predictedAtBudget"] == at_the_time["predictedAtBudget"]
        assert kept["predictedAtBudgetInterval"] == at_the_time["predictedAtBudgetInterval"]
        assert kept["step"] == at_the_time["lastStep"]
    assert [r["error"] for r in final["trackRecord"]] == pytest.approx(
        [w["predictedAtBudget"] - rows[-1]["pass_rate"] for w in written]
    )


def test_track_record_reproduces_the_errors_a_refit_of_the_histories_gives(
    runs: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folders = [str(folder) for folder, _, _ in runs.values()]
    png = tmp_path / "track.png"
    assert main(["track-record", *folders, "--json", "--plot", str(png)]) == 0
    got = {b["seen"]: b for b in json.loads(capsys.readouterr().out)["bySeen"]}
    per_run = [expected_errors(rows) for _, rows, _ in runs.values()]
    for seen in (0.25, 0.5, 0.75):
        errors = [run[seen] for run in per_run]
        assert got[seen]["runs"] == 3
        assert got[seen]["medianError"] == pytest.approx(statistics.median(errors), abs=1e-9)
        assert got[seen]["medianAbsError"] == pytest.approx(
            statistics.median(abs(e) for e in errors), abs=1e-9
        )
    # Coverage and width: from the interval each fit.json showed when it was written.
    for seen in (0.25, 0.5, 0.75):
        shown = []
        for _, rows, written in runs.values():
            by_then = [w for w in written if w["track"][-1]["fractionSeen"] <= seen][-1]
            lo, hi = by_then["predictedAtBudgetInterval"]
            shown.append((lo <= rows[-1]["pass_rate"] <= hi, hi - lo))
        assert got[seen]["coverage"] == pytest.approx(sum(i for i, _ in shown) / 3)
        assert got[seen]["medianWidth"] == pytest.approx(statistics.median(w for _, w in shown))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_table_reads_the_same_figures(runs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    folders = [str(folder) for folder, _, _ in runs.values()]
    assert main(["track-record", *folders, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["bySeen"]
    assert main(["track-record", *folders]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "track record of 3 finished runs"
    for bucket, line in zip(summary, lines[2:5], strict=True):
        cells = line.split()
        assert cells[0] == f"{bucket['seen']:.0%}" and cells[1] == "3"
        assert cells[4] == f"{bucket['medianError']:+.3f}"
        assert cells[6] == f"{bucket['medianWidth']:.3f}"


def test_a_run_not_yet_ended_is_skipped_and_says_why(
    runs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, rows, _ = runs["b"]
    running = tmp_path / "running"
    running.mkdir()
    write_fit(rows[:9], running, min_compute=0.0, budget=BUDGET, units=1)
    assert main(["track-record", str(folder), str(running)]) == 0
    out = capsys.readouterr().out
    assert "track record of 1 finished runs" in out
    assert f"skipped {running}: no trackRecord in fit.json: the run has not ended" in out
    assert main(["track-record", str(running)]) == 2
    assert "none of the 1 folders holds a finished run's track record" in capsys.readouterr().err


def test_a_folder_that_does_not_exist_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["track-record", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: not a run folder" in capsys.readouterr().err
