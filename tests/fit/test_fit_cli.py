"""`scalerl fit FILE` exits 0 or 2 on any file, never with a traceback (issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl.cli import main
from scalerl.fit import fit_curve, sigmoid
from scalerl.fit.report import write_fit
from scalerl.spec import BudgetSpec

EXAMPLE_CURVE = Path(__file__).resolve().parents[2] / "examples" / "curve.csv"

# Issue 7's reproducer: with --min-compute 0 this printed numpy's "LinAlgError: Singular matrix".
SIX_POINTS = """compute,pass_rate
0.0338,0.2266
0.0504,0.2031
0.0644,0.2813
0.0803,0.3125
0.0850,0.2813
0.1012,0.2891
"""


def test_the_six_point_curve_fits_with_min_compute_0(tmp_path: Path, capsys) -> None:
    path = tmp_path / "six.csv"
    path.write_text(SIX_POINTS)
    assert main(["fit", str(path), "--min-compute", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("A", "B", "C_mid", "R0", "A_interval", "points", "bootstrap_failed"):
        assert key in data, key
    assert data["points"] == 6
    assert data["bootstrap"] + data["bootstrap_failed"] == 200


def test_the_summary_says_how_many_replicates_were_dropped(tmp_path: Path, capsys) -> None:
    path = tmp_path / "six.csv"
    path.write_text(SIX_POINTS)
    assert main(["fit", str(path), "--min-compute", "0"]) == 0
    out = capsys.readouterr().out
    data_line = [line for line in out.splitlines() if "bootstrap replicates" in line]
    # Either no replicate failed (no line) or one line says how many of the 200 did.
    assert len(data_line) <= 1
    if data_line:
        assert "of 200 bootstrap replicates failed to refit" in data_line[0]


NASTY_FILES = {
    "nul-bytes": b"compute,pass_rate\n0,0.2\n1,0.\x003\n",
    "binary": bytes(range(256)) * 4,
    "huge-json-integer": b'{"compute": 1' + b"0" * 400 + b', "pass_rate": 0.5}\n',
    "giant-json-integer": b'{"compute": 1' + b"0" * 5000 + b', "pass_rate": 0.5}\n',
    "deep-json": b'{"compute": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    "only-blank-lines": b"\n\n  \n",
    "header-only-spaces": b"   ,  \n1,2\n",
    "four-ties": b"compute,pass_rate\n0,0.2\n5,0.3\n5,0.4\n5,0.3\n5,0.5\n",
    "all-ones": b"compute,pass_rate\n0,1\n1,1\n2,1\n3,1\n4,1\n",
    "all-zeros": b"compute,pass_rate\n0,0\n1,0\n2,0\n3,0\n4,0\n",
    "tiny-compute": b"compute,pass_rate\n0,0.2\n1e-300,0.3\n2e-300,0.4\n3e-300,0.5\n4e-300,0.5\n",
    "huge-compute": b"compute,pass_rate\n0,0.2\n1e300,0.3\n2e300,0.4\n3e300,0.5\n4e300,0.5\n",
}


@pytest.mark.parametrize("case", NASTY_FILES)
def test_a_nasty_file_exits_0_or_2_with_one_error_line(tmp_path: Path, capsys, case: str) -> None:
    path = tmp_path / ("curve.jsonl" if "json" in case else "curve.csv")
    path.write_bytes(NASTY_FILES[case])
    code = main(["fit", str(path), "--bootstrap", "50"])
    captured = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert captured.err.startswith(f"error: {path}")
        assert len(captured.err.splitlines()) == 1


CELLS = st.sampled_from(["0", "1", "0.5", "0.0078125", "1e-6", "1e7", "-1", "nan", "", "x"])


@settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis folder in the shared work tree
    suppress_health_check=[HealthCheck.too_slow],
)
@given(rows=st.lists(st.tuples(CELLS, CELLS), max_size=8), min_compute=st.sampled_from([None, "0"]))
def test_any_csv_exits_0_or_2(tmp_path_factory, rows, min_compute) -> None:
    path = tmp_path_factory.mktemp("csv") / "curve.csv"
    path.write_text("compute,pass_rate\n" + "".join(f"{c},{r}\n" for c, r in rows))
    args = ["fit", str(path), "--bootstrap", "50", "--json"]
    assert main(args + (["--min-compute", min_compute] if min_compute else [])) in (0, 2)


# --- `scalerl fit` of a run's history: the numbers of its fit.json --------------------------


def demo_history(every: int = 5) -> list[dict[str, float]]:
    """A demo-shaped history.jsonl's rows: 128 prompts x 8 samples, standard errors, times."""
    rng = np.random.default_rng(4)
    rows = []
    for step in range(0, 101, every):
        c = 0.071 * step / 100
        means = rng.binomial(8, float(sigmoid(c, 0.95, 1.7, 0.024, 0.18)), size=128) / 8
        rows.append({"step": step, "compute": c, "pass_rate": float(means.mean()),
                     "pass_rate_se": float(means.std(ddof=1) / np.sqrt(128)),
                     "time": 1000.0 + 7.5 * step})  # fmt: skip
    return rows


def write_history(path: Path, rows: list[dict[str, float]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_fit_json_of_a_history_is_its_fit_json(tmp_path: Path, capsys) -> None:
    rows = demo_history()
    run = tmp_path / "run"
    run.mkdir()
    budget = BudgetSpec(max_steps=1000, max_compute_hours=0.5)  # maxComputeHours comes first
    fit_json = write_fit(rows, run, min_compute=0.0, budget=budget, units=3)
    path = write_history(run / "evaluations.jsonl", rows)
    assert main(["fit", str(path), "--json", "--min-compute", "0", "--budget", "0.5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    # What the run keeps over its fits, and its budget as set (the file has no maxSteps).
    run_only = {"track", "trackRecord", "budgetSet"}
    assert {k: v for k, v in fit_json.items() if k not in run_only} == {
        k: v for k, v in printed.items() if k not in ("file", "predicted", *run_only)
    }
    # The half-run backtest, as fit.json has it.
    assert set(printed["backtest"]) >= {"fittedOn", "compute", "predicted", "interval", "actual",
                                        "inside"}  # fmt: skip
    # Independently: the fit weighs each evaluation by its standard error.
    c = [r["compute"] for r in rows]
    y = [r["pass_rate"] for r in rows]
    weighted = fit_curve(c, y, min_compute=0.0, sigma=[r["pass_rate_se"] for r in rows])
    unweighted = fit_curve(c, y, min_compute=0.0)
    assert printed["A"] == pytest.approx(weighted.A, abs=1e-9)
    assert printed["weighted"] is True and abs(weighted.A - unweighted.A) > 1e-6
    # And etaSeconds is wall seconds at the rows' pace: 7.5 s per step of 0.00071 compute.
    assert printed["etaSeconds"]["budget"] == pytest.approx((0.5 - 0.071) * 7.5 / 0.00071)


def test_compare_weighs_each_run_by_its_standard_errors(tmp_path: Path, capsys) -> None:
    rows = demo_history()
    path = write_history(tmp_path / "evaluations.jsonl", rows)
    assert main(["compare", str(path), str(path), "--json", "--min-compute", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    c, y = [r["compute"] for r in rows], [r["pass_rate"] for r in rows]
    weighted = fit_curve(c, y, min_compute=0.0, sigma=[r["pass_rate_se"] for r in rows])
    assert data["a"]["A"] == pytest.approx(weighted.A, abs=1e-9)


def test_predict_at_says_what_is_known_of_an_early_fit(tmp_path: Path, capsys) -> None:
    early = write_history(tmp_path / "early.jsonl", demo_history(every=20))  # 5 trained points
    assert main(["fit", str(early), "--min-compute", "0", "--predict-at", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "  confidence TooEarly: 5 trained evaluations past the compute floor 0" in out
    [line] = [row for row in out.splitlines() if row.startswith("  at compute 0.2:")]
    assert "forecast (law" in line and "; an evaluation there would read [" in line
    # Enough points, but a first half too short to check them.
    unchecked = write_history(tmp_path / "demo.jsonl", demo_history(every=10))
    assert main(["fit", str(unchecked), "--min-compute", "0"]) == 0
    assert (
        "  confidence Unchecked: the half-run check needs 8 evaluations past the floor in the "
        "first half of the compute; it has 5"
    ) in capsys.readouterr().out


def test_a_falling_curve_is_said_not_to_fit_the_law(tmp_path: Path, capsys) -> None:
    path = tmp_path / "falling.csv"
    rates = [0.6, 0.58, 0.55, 0.53, 0.5, 0.49, 0.47, 0.46, 0.45]
    path.write_text("compute,pass_rate\n" + "".join(f"{i},{r}\n" for i, r in enumerate(rates)))
    assert main(["fit", str(path), "--min-compute", "0", "--bootstrap", "0"]) == 0
    assert "the curve falls: it ends below where it started (R0)" in capsys.readouterr().out
    # A rising one does not.
    assert main(["fit", str(EXAMPLE_CURVE), "--bootstrap", "0"]) == 0
    assert "falls" not in capsys.readouterr().out


def test_f5_predict_at_names_the_forecast_and_the_law_apart(tmp_path: Path, capsys) -> None:
    # S6: the late-rise curve (the law, then +0.05 per ln compute past 0.1). Before, the
    # forecast 0.8535 was printed as the "curve" beside A = 0.727, and was --json's pass_rate.
    c = np.geomspace(1e-3, 1.0, 24)
    c[0] = 0.0
    y = np.asarray(sigmoid(c, 0.6, 2.0, 0.03, 0.1), dtype=float)
    y += np.where(c > 0.1, 0.05 * np.log(np.maximum(c, 1e-12) / 0.1), 0.0)
    path = tmp_path / "late_rise.csv"
    path.write_text(
        "step,compute,pass_rate,pass_rate_se\n"
        + "".join(
            f"{i},{float(x)!r},{float(v)!r},0.01\n"
            for i, (x, v) in enumerate(zip(c, y, strict=True))
        )
    )
    args = ["fit", str(path), "--predict-at", "30", "--target", "0.8", "--budget", "30"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [at] = data["predicted"]
    law = fit_curve(c, y, sigma=np.full(c.size, 0.01))
    assert at["law"] == pytest.approx(float(law.predict(30.0)), abs=1e-9)
    assert at["law"] <= data["A"] + 1e-12  # no sigmoid with that A goes higher
    assert at["model"] == data["forecast"]["model"]
    if at["model"] == "law":
        assert at["forecast"] == pytest.approx(at["law"], abs=1e-12)
    assert "BeyondEvidence" in at["forecastNotes"]  # 30 is 30x the data
    assert main(args) == 0
    out = capsys.readouterr().out
    [line] = [row for row in out.splitlines() if row.startswith("  at compute 30:")]
    assert f"forecast ({at['model']}) {at['forecast']:.4f}" in line
    assert "curve" not in line
    assert "the budget lies 30x the fitted compute" in line
    assert "  forecast " in out and "drift weight" in out
