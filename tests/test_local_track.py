"""The local runner keeps every fit's prediction in fit.json as the run goes, and its last fit, once
the run has ended, scores them against the last evaluation (the run's own track record)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from history_rows import history_row

from scalerl.fit import sample_curve
from scalerl.local import LocalRun
from scalerl.spec import load_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"  # maxSteps 100


def history() -> list[dict[str, Any]]:
    """Evaluations every 10 steps as the trainer records them (100 held-out samples each)."""
    steps = np.arange(0, 101, 10)
    compute = 0.001 * steps
    rates = sample_curve(compute, 0.8, 2.0, 0.04, 0.2, noise=0.01, seed=4)
    return [
        history_row(int(s), float(c), float(r)).to_dict()
        for s, c, r in zip(steps, compute, rates, strict=True)
    ]


def write_history(out: Path, rows: list[dict[str, Any]]) -> None:
    (out / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_last_fit_of_a_finished_run_scores_every_prediction_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    runner = LocalRun(load_run(EXAMPLE), out, display=False)
    rows = history()
    for n in (5, 8):  # fits as evaluations arrive
        write_history(out, rows[:n])
        report = runner.refit(rows[:n])
        assert report is not None and "trackRecord" not in report
    write_history(out, rows)
    monkeypatch.setattr(runner, "attempt", lambda: True)  # the gang ran to its budget
    final = runner.execute()
    assert final is not None
    assert final == json.loads((out / "fit.json").read_text())
    track = final["track"]
    assert [p["step"] for p in track] == [40, 70, 100]
    assert [p["fractionSeen"] for p in track] == pytest.approx([0.4, 0.7, 1.0])
    last = rows[-1]["pass_rate"]
    scored = final["trackRecord"]
    assert [r["error"] for r in scored] == pytest.approx(
        [p["predictedAtBudget"] - last for p in track]
    )
    for row in scored:
        lo, hi = row["predictedAtBudgetInterval"]
        assert row["inside"] == (lo <= last <= hi) and row["actual"] == last
