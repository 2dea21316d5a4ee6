"""Benchmark: our fit (grid + refinement + 200-replicate bootstrap) against the paper's plain
procedure (grid over A x C_mid with one scipy curve_fit for B per cell; no refinement, no
bootstrap), on the same 100 synthetic points drawn from Table 1's 8B row with noise 0.006.

    .venv/bin/python bench/fit_bench.py [--repeats N]

Prints the median wall time of each, their ratio, and both fits' A, B, C_mid; and what the
forecast's evidence costs on top of our fit (`FitResult.forecast_model`: up to 8 prefix fits
with 50 bootstrap draws each, judged at the later points; measured once per fit, when a
prediction beyond the data first asks for it), with the model it chose.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from scalerl.fit import PAPER_A_GRID, PAPER_C_MID_RANGE, fit_curve, sample_curve, sigmoid

TRUTH = {"A": 0.610, "B": 1.92, "C_mid": 2542.0, "R0": 0.20}  # Table 1, ScaleRL 8B
COMPUTE_PER_EVAL = 145.0  # 100 steps of the 8B run, GPU-hours
MIN_COMPUTE = 1500.0  # the paper's cut-off


def synthetic_points(
    n: int = 100, noise: float = 0.006, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    compute = np.arange(n) * COMPUTE_PER_EVAL
    return compute, sample_curve(compute, **TRUTH, noise=noise, seed=seed)


def paper_fit(compute: np.ndarray, pass_rate: np.ndarray) -> dict[str, float]:
    """The paper's procedure as written: every (A, C_mid) on its grid, curve_fit B from B = 1."""
    r0 = float(pass_rate[0])
    used = compute >= MIN_COMPUTE
    c, y = compute[used], pass_rate[used]
    best = {"sse": np.inf, "A": np.nan, "B": np.nan, "C_mid": np.nan}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        for a in PAPER_A_GRID:
            for c_mid in np.linspace(*PAPER_C_MID_RANGE, 100):
                try:
                    # p0=[1.0] is curve_fit's default start; it also tells curve_fit that only
                    # b is fitted (the lambda's defaults would otherwise count as parameters).
                    model = lambda x, b, a=a, m=c_mid: sigmoid(x, a, b, m, r0)  # noqa: E731
                    (b,), _ = curve_fit(model, c, y, p0=[1.0])
                except RuntimeError:  # curve_fit gives up on cells far from the data
                    continue
                sse = float(np.sum((sigmoid(c, a, b, c_mid, r0) - y) ** 2))
                if sse < best["sse"]:
                    best = {"sse": sse, "A": float(a), "B": float(b), "C_mid": float(c_mid)}
    return best


def ours(compute: np.ndarray, pass_rate: np.ndarray) -> dict[str, float]:
    result = fit_curve(compute, pass_rate, min_compute=MIN_COMPUTE, bootstrap=200, seed=0)
    return {"sse": result.sse, "A": result.A, "B": result.B, "C_mid": result.C_mid}


def with_forecast(compute: np.ndarray, pass_rate: np.ndarray) -> dict[str, float]:
    """Our fit and the forecast's choice of model (the drift and its evidence)."""
    result = fit_curve(compute, pass_rate, min_compute=MIN_COMPUTE, bootstrap=200, seed=0)
    chosen = result.forecast_model()
    return {"sse": result.sse, "A": result.A, "B": result.B, "C_mid": result.C_mid,
            "weight": float(chosen["weight"])}  # fmt: skip


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Median wall and CPU time over `repeats` runs, and the last run's value.

    CPU time (this process) is shown beside wall time because on a shared machine the wall clock
    also measures the neighbours.
    """
    walls, cpus, value = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        value = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="repeats of our fit (default 5)")
    parser.add_argument(
        "--paper-repeats", type=int, default=3, help="repeats of the paper's (default 3)"
    )
    args = parser.parse_args()
    compute, pass_rate = synthetic_points()
    ours(compute, pass_rate)  # warm-up: first calls pay for imports and caches
    t_ours, cpu_ours, fit_ours = timed(lambda: ours(compute, pass_rate), args.repeats)
    t_paper, cpu_paper, fit_paper = timed(lambda: paper_fit(compute, pass_rate), args.paper_repeats)
    truth = f"A {TRUTH['A']}, B {TRUTH['B']}, C_mid {TRUTH['C_mid']:g}"
    print(f"100 points, Table 1 8B row ({truth}), noise 0.006; median of repeats")
    print(f"{'':34}{'wall (s)':>9}{'cpu (s)':>9}{'A':>9}{'B':>8}{'C_mid':>8}{'SSE':>11}")
    for name, wall, cpu, fit in (
        ("ours: grid+refine+bootstrap 200", t_ours, cpu_ours, fit_ours),
        ("paper: grid, curve_fit per cell", t_paper, cpu_paper, fit_paper),
    ):
        print(
            f"{name:<34}{wall:>9.3f}{cpu:>9.3f}{fit['A']:>9.4f}{fit['B']:>8.3f}"
            f"{fit['C_mid']:>8.0f}{fit['sse']:>11.3e}"
        )
    print(f"ratio paper / ours: {t_paper / t_ours:.1f}x wall, {cpu_paper / cpu_ours:.1f}x cpu")
    t_full, cpu_full, full = timed(lambda: with_forecast(compute, pass_rate), args.repeats)
    print(
        f"ours with the forecast's evidence: {t_full:.3f} s wall, {cpu_full:.3f} s cpu "
        f"({t_full / t_ours:.1f}x the fit alone); drift weight {full['weight']:.2f}"
    )


if __name__ == "__main__":
    main()
