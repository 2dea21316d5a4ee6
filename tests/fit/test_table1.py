"""Acceptance: the fitter recovers every row of the paper's Table 1 from curves like the paper's.

Protocol per row: R0 = 0.2; an evaluation every 100 steps, 100 steps = 145 GPU-h (the 8B run's
pace; the two rows with C_mid ~ 11k GPU-h get a proportionally larger compute per evaluation, so
every curve has ~50 points); a first evaluation at compute 0 (the base model, R0); Gaussian noise
sigma 0.006 (seeded); only points up to 3 C_mid fitted, with the fitter's default min_compute (3 %
of the largest compute: the paper's 1.5k of a 50k GPU-h range). Checked: A within 0.02 (the
paper's margin) and the prediction at 6 C_mid within 0.02 of the true curve.

A's sampling spread is about 0.006-0.010 per row, so 0.02 is about 2 sigma (over seeds 0-9, 97 of
100 row fits pass): the seed is fixed. The slow math+code "code curve" (B = 1.09) is the hardest:
excluding everything below 1.5k GPU-h (0.9 C_mid) leaves its A undetermined to 0.02, which the
tests below it show along with what the fitter reports then.
"""

import numpy as np
import pytest

from scalerl.fit import fit_curve, sample_curve, sigmoid

R0 = 0.2
SEED = 0
NOISE = 0.006
PAPER_MIN_COMPUTE = 1500.0
MARGIN = 0.02

# (run, C_mid GPU-h, B, A) — Table 1 of the paper.
TABLE_1 = [
    ("8B batch 768 14k gen", 2542, 1.92, 0.610),
    ("32k thinking", 11272, 1.89, 0.645),
    ("8 generations per prompt", 2542, 2.44, 0.585),
    ("24 generations per prompt", 3054, 2.22, 0.590),
    ("32 generations per prompt", 2936, 2.07, 0.595),
    ("Scout 17Bx16 MoE", 4242, 1.65, 0.710),
    ("batch 512", 2818, 1.77, 0.605),
    ("batch 2048 the 100k run", 10909, 1.70, 0.645),
    ("math+code math curve", 2896, 2.05, 0.595),
    ("math+code code curve", 1675, 1.09, 0.615),
]
SLOW_ROW = TABLE_1[-1]


def evaluations(c_mid: float, until: float) -> np.ndarray:
    """Compute at every evaluation (every 100 steps) from 0 up to `until`."""
    per_eval = 145.0 if c_mid < 5000 else 145.0 * c_mid / 2542.0
    return np.arange(0.0, until + 1e-9, per_eval)


def fit_row(
    c_mid: float,
    b: float,
    a: float,
    fit_to: float,
    bootstrap: int = 0,
    min_compute: float | None = None,
):
    compute = evaluations(c_mid, fit_to * c_mid)
    pass_rate = sample_curve(compute, a, b, c_mid, R0, noise=NOISE, seed=SEED)
    return fit_curve(compute, pass_rate, min_compute=min_compute, bootstrap=bootstrap, seed=SEED)


@pytest.mark.parametrize(
    ("run", "c_mid", "b", "a"),
    [pytest.param(*row, id=row[0]) for row in TABLE_1],
)
def test_fit_recovers_table1_row_from_points_up_to_3_c_mid(
    run: str, c_mid: float, b: float, a: float
) -> None:
    compute = evaluations(c_mid, 3 * c_mid)
    assert 30 <= compute.size <= 90, f"{run}: {compute.size} evaluations"
    result = fit_row(c_mid, b, a, fit_to=3)
    assert abs(result.A - a) <= MARGIN, f"{run}: A {result.A:.4f}, truth {a}"
    predicted, truth = result.predict(6 * c_mid), sigmoid(6 * c_mid, a, b, c_mid, R0)
    assert abs(predicted - truth) <= MARGIN, f"{run}: R(6 C_mid) {predicted:.4f}, truth {truth:.4f}"


def test_slow_code_curve_from_paper_min_compute_reports_a_wide_interval_holding_the_truth() -> None:
    _, c_mid, b, a = SLOW_ROW
    result = fit_row(c_mid, b, a, fit_to=3, bootstrap=200, min_compute=PAPER_MIN_COMPUTE)
    lo, hi = result.A_interval
    assert lo <= a <= hi
    assert hi - lo > 2 * MARGIN  # the interval says the data cannot pin A to +-0.02
    predicted, truth = result.predict(6 * c_mid), sigmoid(6 * c_mid, a, b, c_mid, R0)
    assert abs(predicted - truth) <= MARGIN


def test_slow_code_curve_is_recovered_once_it_covers_as_much_of_its_gain() -> None:
    # 3 C_mid at B ~ 2 is ~89 % of the gain; B = 1.09 needs ~8 C_mid to get there.
    _, c_mid, b, a = SLOW_ROW
    result = fit_row(c_mid, b, a, fit_to=8, min_compute=PAPER_MIN_COMPUTE)
    assert abs(result.A - a) <= MARGIN
    predicted, truth = result.predict(16 * c_mid), sigmoid(16 * c_mid, a, b, c_mid, R0)
    assert abs(predicted - truth) <= MARGIN


# The issue-43 protocol: R0 0.25, min_compute 1500 GPU-hours (the paper's), the forecast (what
# predictedAtBudget reads) and its 95 % band at 6 C_mid. Before the forecast was chosen by the
# run's own evidence, seed 0 read up to 0.035 off (8B: its early prefix fits had missed, and the
# whole drift was taken) with bands 0.03-0.13 wide.
FORECAST_R0 = 0.25


def test_the_forecast_at_6_c_mid_is_the_law_s_precision_on_table1_curves() -> None:
    errors, widths, held = [], [], 0
    for run, c_mid, b, a in TABLE_1:
        compute = evaluations(c_mid, 3 * c_mid)
        pass_rate = sample_curve(compute, a, b, c_mid, FORECAST_R0, noise=NOISE, seed=SEED)
        result = fit_curve(compute, pass_rate, min_compute=PAPER_MIN_COMPUTE, seed=SEED)
        at = 6 * c_mid
        truth = float(sigmoid(at, a, b, c_mid, FORECAST_R0))
        band = result.predict_interval(at)
        assert band is not None
        errors.append(abs(float(result.forecast(at)) - truth))
        widths.append(band[1] - band[0])
        held += band[0] <= truth <= band[1]
        assert errors[-1] <= MARGIN, f"{run}: forecast {result.forecast(at):.4f}, truth {truth:.4f}"
    assert float(np.median(widths)) <= 0.04
    assert held >= 9  # coverage of the 95 % band: at least 90 %
