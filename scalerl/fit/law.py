"""The sigmoidal compute-performance law of ScaleRL (arXiv 2510.13786, Eq. 1).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

A is the asymptotic pass rate, B > 0 the scaling exponent, C_mid the compute at which half of the
gain A - R0 is reached and R0 the pass rate before any RL compute (R(0) = R0).

We evaluate the law as a logistic function of log C,

    R = R0 + (A - R0) * expit(B * (ln C - ln C_mid)),

because (C_mid / C) ** B overflows for small C and large B, while expit saturates cleanly and
gives R(0) = R0 exactly (ln 0 = -inf). Every function broadcasts over its arguments, so the fitter
can evaluate a whole grid or a whole bootstrap at once.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

FloatArray = NDArray[np.float64]


def log_compute(compute: ArrayLike) -> FloatArray:
    """ln C, with ln 0 = -inf (no warning): the law's natural coordinate."""
    with np.errstate(divide="ignore"):
        logs: FloatArray = np.log(np.asarray(compute, dtype=float))
    return logs


def progress(compute: ArrayLike, B: ArrayLike, C_mid: ArrayLike) -> FloatArray:
    """Fraction of the gain A - R0 reached at `compute`: 0 at C = 0, 1/2 at C_mid, 1 at C = inf."""
    z = np.asarray(B, dtype=float) * (log_compute(compute) - np.log(np.asarray(C_mid, dtype=float)))
    reached: FloatArray = expit(z)
    return reached


def sigmoid(
    compute: ArrayLike, A: ArrayLike, B: ArrayLike, C_mid: ArrayLike, R0: ArrayLike
) -> FloatArray:
    """R(C): the pass rate the law predicts after `compute` units of RL compute."""
    A_, R0_ = np.asarray(A, dtype=float), np.asarray(R0, dtype=float)
    rate: FloatArray = R0_ + (A_ - R0_) * progress(compute, B, C_mid)
    return rate


def compute_to_reach(
    pass_rate: ArrayLike, A: ArrayLike, B: ArrayLike, C_mid: ArrayLike, R0: ArrayLike
) -> FloatArray:
    """The inverse of `sigmoid`: compute at which R(C) = pass_rate.

    nan where the law never reaches that pass rate (outside the open interval between R0 and A).
    """
    frac = (np.asarray(pass_rate, dtype=float) - R0) / (np.asarray(A, dtype=float) - R0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logit = np.log(frac) - np.log1p(-frac)
        out = np.asarray(C_mid, dtype=float) * np.exp(logit / np.asarray(B, dtype=float))
    return np.where((frac > 0) & (frac < 1), out, np.nan)


def gradient(
    compute: ArrayLike, A: ArrayLike, B: ArrayLike, log_c_mid: ArrayLike, R0: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Partial derivatives of R(C) with respect to (A, B, ln C_mid, R0).

    The fitter works in ln C_mid: C_mid spans orders of magnitude (GPU-hours on a cluster,
    process-hours on a laptop), and in log space the bound C_mid > 0 holds by construction.
    Points at C = 0 sit at R0 whatever B and C_mid are, so their B and C_mid derivatives are 0.
    """
    log_c = log_compute(compute)
    u = np.where(np.isfinite(log_c), log_c - np.asarray(log_c_mid, dtype=float), 0.0)
    s = expit(np.where(np.isfinite(log_c), np.asarray(B, dtype=float) * u, -np.inf))
    gain = np.asarray(A, dtype=float) - np.asarray(R0, dtype=float)
    slope = gain * s * (1.0 - s)
    return s, slope * u, -slope * np.asarray(B, dtype=float), 1.0 - s


def sample_curve(
    compute: ArrayLike,
    A: float,
    B: float,
    C_mid: float,
    R0: float,
    *,
    noise: float = 0.0,
    seed: int = 0,
) -> FloatArray:
    """Pass rates drawn from the law with Gaussian noise, clipped to [0, 1].

    For tests, benchmarks and demos: the paper's evaluations (mean@16 over 1,000 prompts) scatter
    by about 0.006 around a smooth curve.
    """
    rng = np.random.default_rng(seed)
    clean = sigmoid(compute, A, B, C_mid, R0)
    return np.clip(clean + rng.normal(0.0, noise, size=np.shape(clean)), 0.0, 1.0)
