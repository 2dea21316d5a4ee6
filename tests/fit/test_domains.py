"""One curve per domain: a math+code run's history gives the combined fit and one fit per domain,
each the fit of that domain's own points (as the paper fits its math+code run, Table 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalerl.fit import fit_curve, sample_curve
from scalerl.fit.domains import a_by_domain, domain_rows, domains_of
from scalerl.fit.points import HISTORY, STATUS
from scalerl.fit.report import write_fit
from scalerl.spec import BudgetSpec

COMPUTE = np.linspace(0.0, 3.0, 18)
# Table 1's math+code run, its compute scaled to ours: math A 0.595 B 2.05, code A 0.615 B 1.09.
MATH = sample_curve(COMPUTE, 0.595, 2.05, 1.2, 0.10, noise=0.005, seed=1)
CODE = sample_curve(COMPUTE, 0.615, 1.09, 0.7, 0.05, noise=0.005, seed=2)
SE = {"math": 0.006, "code": 0.009}
PROMPTS = {"math": 600, "code": 400}


def mixed_history() -> list[dict[str, object]]:
    """history.jsonl of a run whose held-out prompts are 600 math and 400 code ones."""
    rows = []
    for i, (c, m, k) in enumerate(zip(COMPUTE, MATH, CODE, strict=True)):
        combined = (600 * m + 400 * k) / 1000
        by_domain = {
            "math": {"pass_rate": m, "pass_rate_se": SE["math"], "prompts": 600},
            "code": {"pass_rate": k, "pass_rate_se": SE["code"], "prompts": 400},
        }
        rows.append(
            {
                "step": 10 * i,
                "compute": float(c),
                "pass_rate": combined,
                "pass_rate_se": 0.005,
                "pass_rate_by_domain": by_domain,
            }
        )
    return rows


def test_each_domain_is_fitted_on_its_own_points(tmp_path: Path) -> None:
    budget = BudgetSpec(max_steps=10_000, max_compute_hours=6.0)
    report = write_fit(mixed_history(), tmp_path, min_compute=0.0, budget=budget, units=1)
    assert json.loads((tmp_path / "fit.json").read_text()) == report
    assert sorted(report["domains"]) == ["code", "math"]
    for domain, rates in (("math", MATH), ("code", CODE)):
        alone = fit_curve(COMPUTE, rates, min_compute=0.0, sigma=np.full(18, SE[domain]))
        fit = report["domains"][domain]
        assert (fit["A"], fit["B"], fit["C_mid"]) == (alone.A, alone.B, alone.C_mid)
        assert fit["A_interval"] == pytest.approx(list(alone.A_interval))
        assert fit["points"] == 17 and fit["evaluations"] == 18
        assert fit["confidence"] in ("OK", "Misfit")  # the same outlook fields as the combined
    combined = fit_curve(COMPUTE, [r["pass_rate"] for r in mixed_history()], min_compute=0.0,
                         sigma=np.full(18, 0.005))  # fmt: skip
    assert report["A"] == combined.A
    a_math, a_code = report["domains"]["math"]["A"], report["domains"]["code"]["A"]
    assert report["domains"]["math"]["A_atLeast"] is None  # both curves have bent in the data
    assert report["domains"]["code"]["A_atLeast"] is None
    assert report["A_byDomain"] == f"code={a_code:.3g} math={a_math:.3g}"
    assert abs(a_math - 0.595) < 0.03 and abs(a_code - 0.615) < 0.03
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_a_domain_that_cannot_be_fitted_yet_says_why(tmp_path: Path) -> None:
    rows = mixed_history()
    for row in rows[4:]:  # code was measured only in the first 4 evaluations
        del row["pass_rate_by_domain"]["code"]  # type: ignore[attr-defined]
    budget = BudgetSpec(max_steps=10_000, max_compute_hours=6.0)
    report = write_fit(rows, tmp_path, min_compute=0.0, budget=budget, units=1)
    assert set(report["domains"]["code"]) == {"error"}
    assert report["domains"]["code"]["error"]  # the fitter's own reason
    assert "A" in report["domains"]["math"]
    assert report["A_byDomain"].startswith("code=- math")


def test_a_run_of_one_domain_has_no_domain_fits(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "pass_rate_by_domain"} for r in mixed_history()]
    budget = BudgetSpec(max_steps=10_000, max_compute_hours=6.0)
    report = write_fit(rows, tmp_path, min_compute=0.0, budget=budget, units=1)
    assert "domains" not in report and "A_byDomain" not in report


def test_a_domains_series_in_status_names() -> None:
    rows = [
        {"step": 0, "computeHours": 0.0, "passRate": 0.2, "passRateSE": 0.01,
         "byDomain": {"math": {"passRate": 0.1, "passRateSE": 0.02}, "code": {"passRate": 0.3}}},
        {"step": 5, "computeHours": 1.0, "passRate": 0.4, "passRateSE": 0.01,
         "byDomain": {"math": {"passRate": 0.35, "passRateSE": 0.02}}},
    ]  # fmt: skip
    assert domains_of(rows, STATUS.by_domain) == ["code", "math"]
    assert domain_rows(rows, "math", STATUS) == [
        {"step": 0, "computeHours": 0.0, "passRate": 0.1, "passRateSE": 0.02},
        {"step": 5, "computeHours": 1.0, "passRate": 0.35, "passRateSE": 0.02},
    ]
    # A domain's point without its own SE carries none (not the combined one).
    assert domain_rows(rows, "code", STATUS) == [{"step": 0, "computeHours": 0.0, "passRate": 0.3}]
    assert domains_of([{"compute": 0.0, "pass_rate": 0.1}], HISTORY.by_domain) == []
    assert a_by_domain({"math": {"A": 0.5951}, "code": {"error": "too few"}}) == "code=- math=0.595"
    # A curve that has not bent yet bounds A from below only: its bound, as `A>=` shows it.
    assert a_by_domain({"code": {"A": 1.0, "A_atLeast": 0.6426}}) == "code>=0.643"
