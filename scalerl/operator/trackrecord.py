"""status.trackRecord: how good a run's predictions were, kept in its status on a cluster.

A run's status keeps a bounded summary of its track (`scalerl.fit.track`): the prediction each fit
Job wrote that was the latest made by 25, 50 and 75 % of the run (`predictions`, at most three,
each marked `seen`, each with the budget it was made for, `budgetSet`). When the run ends the
operator scores them against its last evaluation (`outcome`: its passRate, computeHours, the
budget it ended under and, for a run its prediction stopped, why; each prediction's `actual`,
`error`, `inside`, `width`). A prediction made for another budget than the run ended under
(the spec's budget was edited) is `void`; those of a run stopped by `budget.stopWhen` are
`censored`, counted apart with what the run read when stopped (`scalerl.fit.track.score`). The
operator pools the scored ones of every run it manages into Prometheus gauges
(`scalerl.metrics.TrackRecordMetrics`).

    record = with_prediction(status.get("trackRecord"), prediction, status["evaluations"])
    record = ended(record, status["evaluations"], budget_set)           # the run Succeeded
    record = ended(record, status["evaluations"], budget_set, stopped)  # stopWhen stopped it
"""

from __future__ import annotations

from typing import Any

from scalerl.status.kubernetes import round_value

TRACK_RECORD = "trackRecord"
Record = dict[str, Any]


def with_prediction(
    record: Record | None, prediction: dict[str, Any], evaluations: list[dict[str, Any]]
) -> Record | None:
    """`record` with the fit's `prediction` (status.prediction's keys) kept, made from
    `evaluations` (those the fit read); `record` itself when there is nothing to keep. A record
    already scored (a last fit after the run ended) is scored again with the same outcome."""
    from scalerl.fit.track import bounded, keep, kept_prediction  # late: the fit Job's

    if not evaluations or not prediction.get("budget"):
        return record
    last = _last(evaluations)
    kept = kept_prediction(prediction, compute=float(last["computeHours"]), step=int(last["step"]))
    kept["fractionSeen"] = round_value(kept["fractionSeen"])
    old = (record or {}).get("predictions") or []
    out: Record = {"predictions": bounded(keep(old, kept))}
    outcome = (record or {}).get("outcome")
    return _scored(out["predictions"], outcome) if outcome else out


def ended(
    record: Record | None,
    evaluations: list[dict[str, Any]],
    budget_set: dict[str, Any] | None = None,
    stopped: str | None = None,
) -> Record | None:
    """`record` scored against the last of `evaluations` (the run has ended under `budget_set`,
    the spec's budget as `scalerl.fit.outlook.budget_set` reads it; or was `stopped` by its
    prediction, for that reason); None when the run kept no prediction or made no evaluation."""
    if not record or not record.get("predictions") or not evaluations:
        return None
    last = _last(evaluations)
    outcome: dict[str, Any] = {
        "passRate": float(last["passRate"]),
        "computeHours": float(last["computeHours"]),
    }
    if budget_set is not None:
        outcome["budgetSet"] = {k: v for k, v in budget_set.items() if v is not None}
    if stopped is not None:
        outcome["stopped"] = stopped
    return _scored(record["predictions"], outcome)


def scored_predictions(record: Record | None) -> list[dict[str, Any]] | None:
    """The scored predictions of a run's status.trackRecord; None until the run is scored."""
    if not record or not record.get("outcome"):
        return None
    return list(record.get("predictions") or [])


def _scored(predictions: list[dict[str, Any]], outcome: dict[str, Any]) -> Record:
    from scalerl.fit.track import Outcome, score

    rows = score(
        predictions,
        Outcome(
            float(outcome["passRate"]),
            float(outcome["computeHours"]),
            budget_set=outcome.get("budgetSet"),
            stopped=outcome.get("stopped"),
        ),
    )
    rounded = [
        {k: round_value(v) if isinstance(v, float) else v for k, v in row.items()} for row in rows
    ]
    return {"predictions": rounded, "outcome": outcome}


def _last(evaluations: list[dict[str, Any]]) -> dict[str, Any]:
    return max(evaluations, key=lambda e: float(e["computeHours"]))
