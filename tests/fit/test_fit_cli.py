"""`scalerl fit FILE` exits 0 or 2 on any file, never with a traceback (issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl.cli import main

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
    code = main(["fit", str(path), "--bootstrap", "20"])
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
    args = ["fit", str(path), "--bootstrap", "10", "--json"]
    assert main(args + (["--min-compute", min_compute] if min_compute else [])) in (0, 2)
