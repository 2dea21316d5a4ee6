"""status.prediction of a math+code run: the combined fit plus one fit per domain, each the fit
of that domain's own pass rates in status.evaluations, and the one-line `A by domain` that
`kubectl get srl -o wide` shows."""

from __future__ import annotations

import numpy as np

from scalerl.fit import fit_curve, sample_curve
from scalerl.operator.crd import PRINTER_COLUMNS, build_crd
from scalerl.operator.prediction import predict
from scalerl.spec import BudgetSpec
from scalerl.status.history import HeldOut, HistoryRow, PromptScore
from scalerl.status.kubernetes import status_evaluation

K = 8
PROMPTS = {"math": 60, "code": 40}
COMPUTE = np.linspace(0.0, 3.0, 18)
CURVES = {
    "math": sample_curve(COMPUTE, 0.595, 2.05, 1.2, 0.10),
    "code": sample_curve(COMPUTE, 0.615, 1.09, 0.7, 0.05),
}


def scores(step: int) -> list[PromptScore]:
    """Each domain's prompts with as many samples correct as its curve says, spread unevenly."""
    out = []
    for domain, n in PROMPTS.items():
        correct = round(float(CURVES[domain][step]) * n * K)
        for i in range(n):
            out.append(PromptScore(f"{domain}/{i}", K, min(K, max(0, correct - i * K)), 0, domain))
    return out


def evaluations() -> list[dict[str, object]]:
    """status.evaluations as trainer 0 writes them (`status_evaluation` of its history rows)."""
    rows = []
    for step, compute in enumerate(COMPUTE):
        held_out = HeldOut.of(scores(step))
        row = HistoryRow.of(
            step=10 * step,
            version=10 * step,
            compute=float(compute),
            time=1.7e9 + 60 * step,
            held_out=held_out,
            train=None,
            counters={},
            trainer_seconds={},
            generation={},
        )
        rows.append(status_evaluation(row.to_dict()))
    return rows


def test_the_prediction_holds_one_fit_per_domain() -> None:
    budget = BudgetSpec(max_steps=10_000, max_compute_hours=6.0)
    prediction = predict(evaluations(), min_compute=0.0, budget=budget, units=1, bootstrap=40)
    assert sorted(prediction["domains"]) == ["code", "math"]
    shown = {}
    for domain, n in PROMPTS.items():
        # Independently: the domain's mean@k from the prompt scores, and its per-prompt SE.
        series, sigma = [], []
        for step in range(len(COMPUTE)):
            mine = [s for s in scores(step) if s.domain == domain]
            means = np.array([s.correct / s.samples for s in mine])
            series.append(sum(s.correct for s in mine) / (n * K))
            sigma.append(float(np.std(means, ddof=1) / np.sqrt(n)))
        # The status rounds to six significant digits; so must the independent fit.
        alone = fit_curve(
            _six(COMPUTE), _six(series), min_compute=0.0, sigma=_six(sigma), bootstrap=40
        )
        fit = prediction["domains"][domain]
        assert fit["A"] == float(f"{alone.A:.6g}")
        assert fit["C_mid"] == float(f"{alone.C_mid:.6g}")
        assert fit["B"] == float(f"{alone.B:.6g}")
        assert fit["points"] == 17
        assert set(fit) <= set(_domain_schema()), set(fit) - set(_domain_schema())
        # kubectl's one line: A, or A's lower bound where the points bound it from below only.
        bound = alone.A_at_least
        shown[domain] = f"{domain}={alone.A:.3g}" if bound is None else f"{domain}>={bound:.3g}"
        assert abs(alone.A - {"math": 0.595, "code": 0.615}[domain]) < 0.04
    assert prediction["A_byDomain"] == f"{shown['code']} {shown['math']}"


def test_a_run_of_one_domain_has_no_domain_entries() -> None:
    one = [{k: v for k, v in e.items() if k != "byDomain"} for e in evaluations()]
    budget = BudgetSpec(max_steps=10_000, max_compute_hours=6.0)
    prediction = predict(one, min_compute=0.0, budget=budget, units=1, bootstrap=40)
    assert "domains" not in prediction and "A_byDomain" not in prediction


def test_kubectl_wide_shows_a_by_domain_from_the_prediction() -> None:
    (column,) = [c for c in PRINTER_COLUMNS if c["name"] == "A by domain"]
    assert column["jsonPath"] == ".status.prediction.A_byDomain" and column["priority"] == 1
    prediction = _status_schema()["prediction"]["properties"]
    assert prediction["A_byDomain"]["type"] == "string"
    assert prediction["domains"]["maxProperties"] == 8


def _six(values: object) -> list[float]:
    return [float(f"{v:.6g}") for v in values]  # type: ignore[attr-defined]


def _status_schema() -> dict[str, dict]:  # type: ignore[type-arg]
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["status"]["properties"]  # type: ignore[no-any-return]


def _domain_schema() -> dict[str, dict]:  # type: ignore[type-arg]
    domains = _status_schema()["prediction"]["properties"]["domains"]
    return domains["additionalProperties"]["properties"]  # type: ignore[no-any-return]
