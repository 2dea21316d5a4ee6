"""The cluster end of the status sink: its pure pieces (tests/cluster/test_status_sink.py runs
it against the real API server)."""

from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

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


def linear_from_zero(count: int, top: float = 1000.0) -> list[dict[str, float]]:
    """`count` evaluations every N steps: the step-0 one at compute 0, the rest even up to `top`."""
    return [{"computeHours": top * i / (count - 1)} for i in range(count)]


def test_thin_of_a_run_from_compute_0_keeps_a_few_hundred_points() -> None:
    # The compute clock starts after the step-0 evaluation, so every run's first point is at 0;
    # log(0) once pulled the log-even grid down to e^-27, and 1001 evaluations kept 51.
    points = linear_from_zero(1001)
    kept = thin(points, 300)
    assert len(kept) == 300  # the README's figure
    assert kept[0] == points[0] and kept[-1] == points[-1]
    # A log-even spread of 299 points over [1, 1000] puts a third of them in the top decade
    # (ln 10 / ln 1000); the sparse early points all stay, which leaves the top more, not fewer.
    top = sum(p["computeHours"] > 100 for p in kept)
    assert top >= 299 // 3
    assert top == 199  # the README's figure


def test_thin_ignores_computes_at_0_past_the_first() -> None:
    points = [{"computeHours": 0.0}] * 5 + linear_from_zero(400)[1:]
    kept = thin(points, 300)
    assert kept[0] is points[0] and kept[-1] == points[-1]
    assert all(p["computeHours"] > 0 for p in kept[1:])


def test_thin_of_a_run_that_never_left_compute_0_keeps_its_ends() -> None:
    points = [{"computeHours": 0.0, "step": i} for i in range(400)]
    assert thin(points, 300) == [points[0], points[-1]]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(1e-6, 1e3), min_size=4, max_size=1500),
    keep=st.integers(3, 300),
)
def test_thin_keeps_at_most_keep_without_a_hole_it_could_fill(
    steps: list[float], keep: int
) -> None:
    computes = [0.0, *itertools.accumulate(steps)]
    points = [{"computeHours": c} for c in computes]
    kept = thin(points, keep)
    assert len(kept) <= keep and kept[0] is points[0] and kept[-1] is points[-1]
    at = [computes.index(p["computeHours"]) for p in kept]
    assert at == sorted(set(at))  # a subsequence, in order
    if len(points) <= keep:
        return
    logs = [math.log(c) for c in computes[1:]]
    even = (logs[-1] - logs[0]) / (keep - 2)  # the log gap of `keep - 1` points spread evenly
    for a, b in itertools.pairwise(i - 1 for i in at[1:]):
        # Two kept points lie at most two even gaps apart, or a gap between neighbours more:
        # no hole on the log axis that a point left out could have filled.
        widest = max(y - x for x, y in itertools.pairwise(logs[a : b + 1]))
        assert logs[b] - logs[a] <= 2 * even + widest + 1e-9


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
