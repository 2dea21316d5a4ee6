"""The batched Levenberg-Marquardt solver against scipy's least_squares, problem by problem."""

import numpy as np
import pytest
from scipy.optimize import least_squares

from scalerl.fit.solver import solve_batched

X = np.linspace(0.0, 4.0, 30)


def exponential_problems(targets: np.ndarray):
    """Residuals of y = p0 * exp(-p1 x) against each row of `targets`."""

    def fun(theta: np.ndarray, rows: np.ndarray):
        p0, p1 = theta[:, :1], theta[:, 1:]
        e = np.exp(-p1 * X)
        resid = p0 * e - targets[rows]
        return resid, np.stack([e, -p0 * X * e], axis=-1)

    return fun


def test_each_problem_reaches_the_same_minimum_as_least_squares() -> None:
    rng = np.random.default_rng(0)
    truths = np.column_stack([rng.uniform(0.5, 2.0, 8), rng.uniform(0.2, 1.5, 8)])
    targets = truths[:, :1] * np.exp(-truths[:, 1:] * X) + rng.normal(0, 0.02, (8, X.size))
    lower, upper = np.array([0.0, 0.0]), np.array([np.inf, np.inf])
    ours = solve_batched(exponential_problems(targets), np.ones((8, 2)), lower, upper)
    for k in range(8):
        ref = least_squares(
            lambda p, k=k: p[0] * np.exp(-p[1] * X) - targets[k], np.ones(2), bounds=(lower, upper)
        )
        np.testing.assert_allclose(ours[k], ref.x, rtol=1e-5)


def test_solutions_stay_inside_the_bounds() -> None:
    targets = np.tile(3.0 * np.exp(-0.5 * X), (2, 1))  # unconstrained optimum p0 = 3
    lower, upper = np.array([0.0, 0.0]), np.array([2.0, np.inf])
    ours = solve_batched(exponential_problems(targets), np.ones((2, 2)), lower, upper)
    assert np.all(ours[:, 0] <= 2.0)
    assert ours[0, 0] == pytest.approx(2.0)
