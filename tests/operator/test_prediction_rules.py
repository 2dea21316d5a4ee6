"""The prediction's rules that need no server: when a run stops on its prediction, and what the
fit Job's event says it reads (tests/cluster/test_fit_run.py runs the fit on a real server)."""

from __future__ import annotations

import pytest

from scalerl.operator.lifecycle import fitted
from scalerl.operator.prediction import stop_reason
from scalerl.spec import BudgetSpec


@pytest.mark.parametrize(
    ("interval", "points", "stops"),
    [([0.30, 0.40], 8, True), ([0.30, 0.55], 8, False), ([0.30, 0.40], 7, False)],
)
def test_the_stop_rule_needs_the_whole_interval_below_and_enough_points(
    interval: list[float], points: int, stops: bool
) -> None:
    budget = BudgetSpec.model_validate({"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}})
    prediction = {"A": 0.35, "A_interval": interval, "points": points}
    assert (stop_reason(budget, prediction) is not None) == stops
    assert stop_reason(BudgetSpec(), prediction) is None


def test_the_fit_event_says_when_it_reads_thinned_evaluations() -> None:
    assert fitted(20, 20) == "20 evaluations"
    assert fitted(300, 1001) == (
        "300 of 1001 evaluations (status.evaluations, thinned evenly on log compute)"
    )
