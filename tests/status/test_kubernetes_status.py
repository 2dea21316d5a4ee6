"""The cluster end of the status sink: its pure pieces (tests/cluster/test_status_sink.py runs
it against the real API server)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from scalerl.status import FileStatus, open_status
from scalerl.status.history import Progress, TrainSummary
from scalerl.status.kubernetes import placed, status_evaluation, status_progress, thin

# --- pure --------------------------------------------------------------------------------------


def test_thin_keeps_everything_below_the_bound(history_row) -> None:
    points = [status_evaluation(history_row(i, 1.0 + i).to_dict()) for i in range(10)]
    assert thin(points, 300) == points


def test_thin_spreads_points_evenly_on_log_compute(history_row) -> None:
    points = [
        status_evaluation(history_row(i, 1.001**i).to_dict()) for i in range(8000)
    ]  # even on log compute
    kept = thin(points, 300)
    assert 290 <= len(kept) <= 300
    assert kept[0] == points[0] and kept[-1] == points[-1]
    logs = [math.log(p["computeHours"]) for p in kept]
    gaps = [b - a for a, b in zip(logs, logs[1:], strict=False)]
    assert max(gaps) < 2 * (logs[-1] - logs[0]) / 299  # no hole anywhere on the log axis


def test_thin_keeps_the_sparse_early_points_of_a_linear_schedule(history_row) -> None:
    # Evaluations every N steps are even on linear compute: the early ones are far apart on the
    # log axis, where the curve rises, and all of them stay.
    points = [status_evaluation(history_row(i, 0.01 * (i + 1)).to_dict()) for i in range(5000)]
    kept = thin(points, 300)
    assert len(kept) <= 300
    assert kept[:20] == points[:20] and kept[-1] == points[-1]


def test_progress_uses_the_crds_names_and_drops_what_is_not_a_number() -> None:
    progress = status_progress(
        Progress(
            step=12,
            version=12,
            compute=1.23456789,
            max_steps=100,
            time=1.0,
            train=TrainSummary(pass_rate=0.5, truncation_rate=float("nan"), entropy=0.4),
            eval_pass_rate=None,
            no_signal=None,
        )
    )
    assert progress.pop("updatedAt").endswith("Z")
    assert progress == {
        "step": 12,
        "policyVersion": 12,
        "maxSteps": 100,
        "computeHours": 1.23457,
        "trainPassRate": 0.5,
        "entropy": 0.4,
    }


def test_an_evaluation_in_the_status_is_the_held_out_one(history_row) -> None:
    row = history_row(40, 2.5, pass_rate=0.37)
    assert row.train_pass_rate == 0.5  # the training batch's, which must not leak in
    got = status_evaluation(row.to_dict())
    assert got["passRate"] == 0.37 and got["samples"] == 100
    assert got["passRateSE"] == float(f"{row.pass_rate_se:.6g}") > 0


def test_a_nan_never_reaches_the_api_server(history_row) -> None:
    row = history_row(1, 0.1).to_dict() | {"pass_rate_se": float("nan")}
    assert "passRateSE" not in status_evaluation(row)


def test_a_field_that_is_not_a_finite_number_is_named_in_a_warning(history_row, caplog) -> None:
    row = history_row(1, 0.1).to_dict()
    with caplog.at_level(logging.WARNING, logger="scalerl.status.kubernetes"):
        sent = placed(row | {"eval_truncation_rate": float("inf")})
        lost = placed(row | {"pass_rate": float("nan")})
    assert sent is not None and "truncationRate" not in sent and sent["passRate"] == 0.3
    assert lost is None  # no place on the curve: the CRD requires passRate and computeHours
    warned = [r.getMessage() for r in caplog.records]
    assert "truncationRate" in warned[0] and "passRate" in warned[1], warned


def test_open_status_picks_the_end_from_the_target(tmp_path: Path) -> None:
    assert isinstance(open_status("files", tmp_path), FileStatus)
