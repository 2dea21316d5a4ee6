"""The `scalerl fit` and `scalerl compare` commands, as a user runs them."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalerl.cli import main, prediction_line
from scalerl.fit import sample_curve

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "curve.csv"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def scalerl_command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "scalerl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "scalerl.cli"]


def write_curve(path: Path, a: float, b: float, seed: int = 0) -> Path:
    compute = np.arange(50) * 145.0
    pass_rate = sample_curve(compute, a, b, 2542.0, 0.2, noise=0.004, seed=seed)
    lines = ["compute,pass_rate"] + [
        f"{c},{r:.5f}" for c, r in zip(compute, pass_rate, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fit_json_prints_one_object_with_the_fit_and_predictions(capsys) -> None:
    code = main(["fit", str(EXAMPLE), "--json", "--predict-at", "20000", "100000"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)  # exactly one JSON document
    for key in ("A", "B", "C_mid", "R0", "A_interval", "C_mid_interval", "points"):
        assert key in data, key
    assert abs(data["A"] - 0.61) <= 0.02  # the example is Table 1's 8B row with noise
    lo, hi = data["A_interval"]
    assert lo <= data["A"] <= hi
    assert [p["compute"] for p in data["predicted"]] == [20000.0, 100000.0]
    assert all(abs(p["forecast"] - data["A"]) < 0.02 for p in data["predicted"])


def test_fit_prints_a_readable_summary(capsys) -> None:
    assert main(["fit", str(EXAMPLE), "--predict-at", "50000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{EXAMPLE}: fitted ")
    names = [line.split()[0] for line in lines[1:5]]
    assert names == ["A", "B", "C_mid", "R0"]
    assert "95% interval [" in lines[1]
    # The forecast's band, then the wider interval an evaluation there would read, and that
    # 50000 lies past what the calibration evidence covers (6.9x the fitted compute).
    assert lines[5].strip().startswith("at compute 50000: forecast (law) 0.6")
    assert "; an evaluation there would read [" in lines[5]
    assert "beyond the 3x the calibration evidence covers" in lines[5]
    assert lines[0].endswith("compute in the file's units")


def test_fit_options_reach_the_fitter(capsys) -> None:
    args = [
        "fit",
        str(EXAMPLE),
        "--json",
        "--min-compute",
        "1500",
        "--r0",
        "fit",
        "--bootstrap",
        "0",
    ]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["min_compute"] == 1500.0 and data["r0"] == "fit"
    assert data["A_interval"] is None and data["excluded"] == 11


def test_fit_writes_a_plot(tmp_path: Path, capsys) -> None:
    png = tmp_path / "fit.png"
    assert main(["fit", str(EXAMPLE), "--plot", str(png), "--predict-at", "30000"]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert f"plot written to {png}" in capsys.readouterr().out


def test_compare_prints_the_verdict_by_asymptote(tmp_path: Path, capsys) -> None:
    high = write_curve(tmp_path / "high.csv", a=0.66, b=1.6)
    low = write_curve(tmp_path / "low.csv", a=0.60, b=2.4, seed=1)
    assert main(["compare", str(low), str(high)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("a  ") and out[1].startswith("b  ")
    assert out[2].startswith(f"verdict: {high} is better: higher asymptote")


def test_compare_json_by_efficiency(tmp_path: Path, capsys) -> None:
    slow = write_curve(tmp_path / "slow.csv", a=0.61, b=1.5)
    fast = write_curve(tmp_path / "fast.csv", a=0.61, b=2.3, seed=1)
    assert main(["compare", str(slow), str(fast), "--json", "--bootstrap", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rule"] == "efficiency" and data["winner"] == "b"
    assert data["winner_file"] == str(fast)
    assert data["B_b"] > data["B_a"]
    assert data["a"]["file"] == str(slow) and "A" in data["b"]


BAD_FILES = {
    "missing-file": (None, "no such file"),
    "empty-file": ("", "file is empty"),
    "missing-column": ("compute,score\n0,0.2\n", "missing column 'pass_rate'"),
    "not-a-number": (
        "compute,pass_rate\n0,0.2\n145,high\n",
        ":3: column 'pass_rate': 'high' is not a number",
    ),
    "nan": ("compute,pass_rate\n0,0.2\n145,nan\n", ":3: column 'pass_rate' is nan"),
    "too-few-points": (
        "compute,pass_rate\n0,0.2\n100,0.3\n200,0.4\n300,0.45\n",
        "only 3 points with compute > 0 at or above min_compute 9 (of 4); the fit needs at least 4",
    ),
    "unsorted": ("compute,pass_rate\n0,0.2\n200,0.3\n100,0.4\n", ":4: compute 100 is smaller than"),
    "bad-jsonl": ('{"compute": 0, "pass_rate": 0.2}\n{"compute": \n', ":2: not valid JSON"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_input_exits_2_with_one_line_naming_the_problem(
    tmp_path: Path, capsys, case: str
) -> None:
    text, message = BAD_FILES[case]
    path = tmp_path / ("curve.jsonl" if case == "bad-jsonl" else "curve.csv")
    if text is not None:
        path.write_text(text)
    assert main(["fit", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"error: {path}")
    assert message in lines[0]


def test_compare_names_the_bad_file(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "b.csv"
    bad.write_text("compute\n1\n")
    assert main(["compare", str(EXAMPLE), str(bad)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {bad}:1: missing column 'pass_rate' (header has: compute)\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["fit"],
        ["fit", "x.csv", "--r0", "guess"],
        ["fit", "x.csv", "--min-compute", "-1"],
        ["fit", "x.csv", "--predict-at", "nan"],
        ["fit", "x.csv", "--bootstrap", "-3"],
        ["fit", "x.csv", "--bootstrap", "10"],  # B17: no "95% interval" from 10 draws
        ["fit", "x.csv", "--budget", "0"],
        ["fit", "x.csv", "--target", "80"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2_with_usage(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    assert "usage: scalerl" in capsys.readouterr().err


def test_help_exits_0(capsys) -> None:
    assert main(["fit", "--help"]) == 0
    assert "--predict-at" in capsys.readouterr().out


def test_console_script_fits_the_example() -> None:
    done = subprocess.run(
        [*scalerl_command(), "fit", str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["points"] > 40


def test_console_script_reports_bad_input_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "missing.csv"
    done = subprocess.run(
        [*scalerl_command(), "fit", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr == f"error: {path}: no such file\n"
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_module_entry_point_runs() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerl.cli",
            "compare",
            str(EXAMPLE),
            str(EXAMPLE),
            "--bootstrap",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: tie" in done.stdout


def test_fewer_bootstrap_replicates_than_50_are_refused_with_the_reason(capsys) -> None:
    assert main(["fit", str(EXAMPLE), "--bootstrap", "1"]) == 2
    assert "use at least 50, or 0 for none" in capsys.readouterr().err
    assert main(["fit", str(EXAMPLE), "--bootstrap", "0"]) == 0


# --- `scalerl run`'s last line ----------------------------------------------------------------

FIT = {
    "A": 0.95, "A_interval": [0.90, 0.99], "A_atLeast": None, "C_mid": 0.024, "B": 1.7,
    "budget": 0.071, "predictedAtBudget": 0.83, "predictedAtBudgetInterval": [0.80, 0.85],
    "confidence": "OK", "confidenceReason": None,
}  # fmt: skip


def test_the_last_line_says_a_target_beyond_the_budget_is_not_reached() -> None:
    # The audit's S4: the demo's budget is 0.071 process-hours; the forecast reaches 0.9 at 0.3048.
    line = prediction_line({**FIT, "computeToTarget": 0.3048}, "process-hours", 0.9)
    assert "reached" not in line
    assert (
        ", target 0.9 lies beyond the budget (the forecast reaches it at compute 0.3048 "
        "process-hours)"
    ) in line
    assert "forecast (law) at budget 0.071 process-hours: 0.830 [0.800, 0.850]" in line
    assert "C_mid = 0.024 process-hours" in line
    within = prediction_line({**FIT, "computeToTarget": 0.05}, "process-hours", 0.8)
    assert ", target 0.8 reached at compute 0.05 process-hours" in within
    # A's interval [0.90, 0.99] holds 0.97: not "A is below", the forecast at the budget is (F4).
    below = prediction_line({**FIT, "computeToTarget": None}, "GPU-hours", 0.97)
    assert ", the forecast at the budget (0.830) is below target 0.97" in below
    assert "A is below" not in below


def test_the_last_line_says_why_a_fit_is_unchecked_and_shows_a_lower_bound() -> None:
    why = "the half-run check needs 8 evaluations past the floor in the first half of the compute; it has 5"  # noqa: E501
    fit = {**FIT, "confidence": "Unchecked", "confidenceReason": why, "computeToTarget": None}
    line = prediction_line(fit, "process-hours")
    assert line.endswith(f"; Unchecked: {why}")
    assert prediction_line(FIT | {"computeToTarget": None}, "x").endswith(
        "; OK: the half-run check held"
    )
    bounded = prediction_line({**fit, "A_atLeast": 0.812}, "process-hours")
    assert bounded.startswith("prediction: A >= 0.812 (the points bound it from below only)")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_ends_a_run_with_one_line_and_the_shell_s_exit_code(
    monkeypatch, capsys, signum: int, code: int
) -> None:
    from scalerl.local import Interrupted

    def interrupted(args: object) -> int:
        raise Interrupted(42, signum)

    monkeypatch.setattr("scalerl.local.run_local", lambda *a, **k: interrupted(a))
    assert main(["run", str(Path(__file__).parents[1] / "examples" / "local.yaml")]) == code
    captured = capsys.readouterr()
    assert captured.err == "stopped at step 42; run the same command again to resume\n"
    assert captured.out == ""


def test_fit_says_whether_the_target_is_reached_within_the_budget(capsys) -> None:
    from scalerl.fit import fit_curve, load_curve

    curve = load_curve(EXAMPLE)
    law = fit_curve(curve.compute, curve.pass_rate, bootstrap=0)
    # By hand: 0.6 = R0 + (A - R0) / (1 + (C_mid / C)^B)  =>  C = C_mid (A-R0 / 0.6-R0 - 1)^(-1/B)
    at = law.C_mid * ((law.A - law.R0) / (0.6 - law.R0) - 1.0) ** (-1.0 / law.B)
    assert curve.compute[-1] < at < 1e5
    assert main(["fit", str(EXAMPLE), "--target", "0.6", "--bootstrap", "0"]) == 0
    assert (
        f"  target 0.6 lies beyond the budget (the forecast reaches it at compute {at:.4g} in the "
        "file's units)"
    ) in capsys.readouterr().out
    beyond = ["--target", "0.6", "--budget", "1e5", "--bootstrap", "0"]
    assert main(["fit", str(EXAMPLE), *beyond]) == 0
    assert f"  target 0.6 reached at compute {at:.4g} in the file's units" in (
        capsys.readouterr().out
    )
    assert main(["fit", str(EXAMPLE), "--target", "0.9", "--bootstrap", "0"]) == 0
    # Without a bootstrap A has no interval to be below a target by: the forecast at the budget
    # (the last point's compute here) is what the line compares.
    below = capsys.readouterr().out
    forecast = law.R0 + (law.A - law.R0) / (1 + (law.C_mid / curve.compute[-1]) ** law.B)
    assert f"the forecast at the budget ({forecast:.3f}) is below target 0.9" in below
