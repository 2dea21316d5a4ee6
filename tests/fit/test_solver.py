"""The batched Levenberg-Marquardt solver against scipy's least_squares, problem by problem."""

import numpy as np
import pytest
from scipy.optimize import least_squares

from scalerl.fit.solver import _lm_step, solve_batched

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
    ours, ok = solve_batched(exponential_problems(targets), np.ones((8, 2)), lower, upper)
    assert ok.all()
    for k in range(8):
        ref = least_squares(
            lambda p, k=k: p[0] * np.exp(-p[1] * X) - targets[k], np.ones(2), bounds=(lower, upper)
        )
        np.testing.assert_allclose(ours[k], ref.x, rtol=1e-5)


def test_solutions_stay_inside_the_bounds() -> None:
    targets = np.tile(3.0 * np.exp(-0.5 * X), (2, 1))  # unconstrained optimum p0 = 3
    lower, upper = np.array([0.0, 0.0]), np.array([2.0, np.inf])
    ours, _ = solve_batched(exponential_problems(targets), np.ones((2, 2)), lower, upper)
    assert np.all(ours[:, 0] <= 2.0)
    assert ours[0, 0] == pytest.approx(2.0)


def test_a_rank_deficient_problem_that_keeps_improving_does_not_raise() -> None:
    # r = exp(-(p0 + p1)): both columns of J are equal, so J^T J is singular, and the minimum is
    # at infinity, so every step succeeds. Unfloored, the damping fell below 1e-16 after 14 steps
    # and LAPACK then reported the damped matrix singular (LinAlgError).
    def fun(theta: np.ndarray, rows: np.ndarray):
        e = np.exp(-(theta[:, :1] + theta[:, 1:]))
        return e, np.stack([-e, -e], axis=-1)

    theta, ok = solve_batched(
        fun, np.zeros((2, 2)), np.full(2, -np.inf), np.full(2, np.inf), max_iter=30
    )
    assert np.isfinite(theta).all() and theta.sum(axis=1).min() > 20.0
    assert not ok.any()  # out of iterations, still descending: not converged


def test_a_singular_step_falls_back_to_the_pseudo_inverse() -> None:
    jac = np.array([[[1.0, 2.0], [2.0, 4.0]]])  # rank 1
    step = _lm_step(np.array([[1.0, 1.0]]), jac, np.array([0.0]))
    assert np.isfinite(step).all()
    # the least-squares step: J delta is -r projected onto J's column space
    np.testing.assert_allclose(jac[0] @ step[0], [-0.6, -1.2])


def test_a_problem_with_a_non_finite_start_is_reported_not_raised() -> None:
    targets = np.vstack([np.exp(-X), np.full(X.size, np.nan)])
    theta, ok = solve_batched(
        exponential_problems(targets), np.ones((2, 2)), np.zeros(2), np.full(2, np.inf)
    )
    assert ok.tolist() == [True, False]
    np.testing.assert_allclose(theta[0], [1.0, 1.0], rtol=1e-6)
