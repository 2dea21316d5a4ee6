"""The calibration evidence the docs quote is kept apart by where it comes from (audit F7): the
development set (the published curves the forecast's rules were tuned on), the law-following
synthetic sets, and own runs; no in-sample figure passes for out-of-sample evidence, and no
figure from before the forecast's change is quoted as current."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from scalerl.fit.backtest import backtest
from scalerl.fit.points import load_curve

ROOT = Path(__file__).resolve().parents[2]
SETS = ("development set", "law-following synthetic", "own runs")


def evidence_table(text: str) -> list[str]:
    """The rows of the table under 'How far to trust a prediction'."""
    section = text.split("## How far to trust a prediction", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]


def test_f7_each_quoted_figure_names_the_set_it_comes_from() -> None:
    rows = evidence_table((ROOT / "docs" / "predictions.md").read_text())[1:]  # no header
    assert rows, "no evidence table"
    for row in rows:
        assert any(name in row.lower() for name in SETS), row
    named = {name for name in SETS if any(name in row.lower() for row in rows)}
    assert named == set(SETS)


def test_f7_no_in_sample_or_stale_figure_is_quoted_as_evidence() -> None:
    for doc in ("predictions.md", "benchmarks.md"):
        text = (ROOT / "docs" / doc).read_text()
        # The drift's "10 of 10" was measured on the very curves its rules were chosen on.
        assert "10 of 10" not in text, doc
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    # The demo row's figures predate the drift (94819f9 before 6542154): quoted only as such.
    for match in re.finditer(r"0\.924 \[0\.874, 0\.964\]", bench):
        window = bench[max(0, match.start() - 400) : match.end() + 400]
        assert "before the drift" in window
    # The calibration bench prints the same names the docs quote.
    source = (ROOT / "bench" / "calibration.py").read_text()
    for name in SETS:
        assert name in source, name


@pytest.mark.parametrize("kept", ["x1", "x2"])
def test_the_own_runs_the_docs_quote_are_kept_and_read_as_quoted(kept: str) -> None:
    # bench/own-runs keeps the evaluations of the own runs the docs quote (bench/calibration.py
    # --export): at the examples' budgets (x1) and twice them (x2). Their half-run backtests, as
    # the product runs them, give the figures the row names, so the row cannot go stale while
    # the fit changes.
    folder = f"bench/own-runs/{kept}"
    rows = evidence_table((ROOT / "docs" / "predictions.md").read_text())
    row = next(r for r in rows if folder in r)
    runs = sorted((ROOT / folder).glob("*.csv"))
    names = [path.stem.rsplit("-", 1)[0] for path in runs]
    suffix = "" if kept == "x1" else f"-{kept}"
    assert names == [f"chat-arith{suffix}"] * 3 + [f"demo{suffix}"] * 3
    checks = []
    for path in runs:
        curve = load_curve(path)
        check = backtest(curve.compute, curve.pass_rate, sigma=curve.pass_rate_se)
        assert check is not None and check.interval is not None, path
        checks.append(check)
    quoted = re.search(
        r"(\d) of 6 inside, median signed error ([+-]\d\.\d{3}), median width (\d\.\d{3})", row
    )
    assert quoted is not None, row
    inside = sum(b.interval[0] <= b.actual <= b.interval[1] for b in checks if b.interval)
    errors = [b.predicted - b.actual for b in checks]
    widths = [b.interval[1] - b.interval[0] for b in checks if b.interval]
    assert int(quoted[1]) == inside
    assert float(quoted[2]) == pytest.approx(statistics.median(errors), abs=0.0006)
    assert float(quoted[3]) == pytest.approx(statistics.median(widths), abs=0.0006)
