"""The paper's grid search (step 3 of `scalerl.fit.fitter`'s procedure): the best B for every
(A, C_mid) cell, all cells' B fits at once, and the candidate A and C_mid values."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import expit

from scalerl.errors import FitError, InputError
from scalerl.fit.law import log_compute
from scalerl.fit.problem import Box, FloatArray, Problem
from scalerl.fit.solver import solve_batched

PAPER_A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
PAPER_C_MID_RANGE = (100.0, 40000.0)
A_STEP = 0.005
C_MID_GRID_SIZE = 100
# The C_mid grid reaches this many times the largest fitted compute.
C_MID_GRID_REACH = 100.0
COARSE_B = np.geomspace(0.05, 20.0, 40)


def candidate_a(a_grid: ArrayLike | None, r0: float, y: FloatArray) -> FloatArray:
    """Candidate asymptotes: the paper's 0.450..0.800 extended to cover max(R0, max y)..1.0."""
    grid: FloatArray
    if a_grid is not None:
        grid = _option_array(a_grid, "a_grid")
        grid = grid[grid > r0]
    else:
        top = math.floor(max(r0, float(y.max())) / A_STEP) * A_STEP
        # A run that falls below its start (a flat or failing one) also gets the asymptotes
        # down to its lowest point: a falling curve is the law with A < R0.
        bottom = math.floor(float(y.min()) / A_STEP) * A_STEP if y.min() < r0 else top
        start = min(float(PAPER_A_GRID[0]), top, bottom)
        grid = np.round(np.arange(start, 1.0 + 1e-9, A_STEP), 3)
        # A = R0 makes the curve flat and B meaningless: only asymptotes above R0 are
        # candidates, or below it when the run fell there.
        grid = grid[(grid > r0) | ((grid < r0) & (y.min() < r0))]
    grid = grid[(grid >= 0.0) & (grid <= 1.0) & (grid != r0)]
    if grid.size == 0:
        raise FitError(
            f"R0 = {r0:g} leaves no room below 1.0 (or the A grid) for the curve to rise"
        )
    return grid


def candidate_c_mid(c_mid_grid: ArrayLike | None, c: FloatArray) -> FloatArray:
    """Candidate midpoints, log-spaced from a tenth of the smallest positive fitted compute to
    C_MID_GRID_REACH x the largest: the law is a logistic in log compute, and a curve that has not
    bent yet has its midpoint beyond the data (a grid that stops at the data's end makes it bend
    there, which is what half-run fits underpredicted by)."""
    if c_mid_grid is not None:
        grid = _option_array(c_mid_grid, "c_mid_grid")
        if grid.size == 0 or not np.all((grid > 0) & np.isfinite(grid)):
            raise InputError("c_mid_grid must hold finite positive values")
        return grid
    low, high = float(c[c > 0][0]) / 10.0, C_MID_GRID_REACH * float(c[-1])
    return np.geomspace(low, high, C_MID_GRID_SIZE)


def _option_array(values: ArrayLike, name: str) -> FloatArray:
    try:
        return np.array(values, dtype=float).ravel()
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be an array of numbers ({err})") from None


class Grid(NamedTuple):
    """The grid search: its best cell (A, B, ln C_mid, R0), and every cell's B and SSE."""

    start: FloatArray
    a: FloatArray  # (nA,)
    log_c_mid: FloatArray  # (nC,)
    b: FloatArray  # (nA, nC)
    sse: FloatArray  # (nA, nC)


def grid_search(
    c: FloatArray,
    y: FloatArray,
    w: FloatArray,
    r0: float,
    grid_a: FloatArray,
    grid_c: FloatArray,
    box: Box,
) -> Grid:
    """The paper's grid: best B for every (A, C_mid) cell, then the cell with the lowest
    (weighted) SSE."""
    log_c_mid = np.log(grid_c)
    cells_a, cells_lc = (g.ravel() for g in np.meshgrid(grid_a, log_c_mid, indexing="ij"))
    b0 = coarse_b(c, y, w, r0, grid_a, log_c_mid).ravel()
    base = np.column_stack([cells_a, b0, cells_lc, np.full(cells_a.size, r0)])
    problem = Problem(c, y[None, :], base, np.array([False, True, False, False]), w)
    # A cell that ran out of iterations still has a valid B and SSE: only non-finite cells are out.
    b = solve_batched(problem, b0[:, None], box[0][1:2], box[1][1:2], max_iter=50).theta
    resid = problem(b, np.arange(b.shape[0]))[0]
    sse = np.einsum("kn,kn->k", resid, resid)
    sse[~np.isfinite(sse)] = np.inf
    best = int(np.argmin(sse))
    if not math.isfinite(sse[best]):
        raise FitError("no cell of the (A, C_mid) grid gave a finite fit")
    shape = (grid_a.size, grid_c.size)
    return Grid(
        start=np.array([cells_a[best], b[best, 0], cells_lc[best], r0]),
        a=grid_a,
        log_c_mid=log_c_mid,
        b=b[:, 0].reshape(shape),
        sse=sse.reshape(shape),
    )


def coarse_b(
    c: FloatArray,
    y: FloatArray,
    w: FloatArray,
    r0: float,
    grid_a: FloatArray,
    log_c_mid: FloatArray,
) -> FloatArray:
    """For every (A, C_mid) cell, the best B of a coarse log-spaced grid: the start of its B fit.

    For fixed B and C_mid the law is linear in A - R0, so SSE(A) = T - 2 a S1 + a^2 S2 gives every
    A's SSE from two sums (each term weighted by w^2), and the whole (A, B, C_mid) cube costs one
    (B, C_mid, n) evaluation.
    """
    log_c = log_compute(c)
    z = COARSE_B[:, None, None] * (log_c[None, None, :] - log_c_mid[None, :, None])
    s = expit(z)  # (nB, nC, n)
    dev, w2 = y - r0, w * w
    s1 = s @ (w2 * dev)
    s2, total = np.einsum("bcn,bcn,n->bc", s, s, w2), float(dev @ (w2 * dev))
    a = (grid_a - r0)[:, None, None]
    sse = total - 2.0 * a * s1[None] + a * a * s2[None]  # (nA, nB, nC)
    # A non-finite SSE (an inf from a C_mid grid overflow) must not win argmin: rank it last.
    sse = np.where(np.isfinite(sse), sse, np.inf)
    best: FloatArray = COARSE_B[np.argmin(sse, axis=1)]  # (nA, nC)
    return best
