"""Every name a tracker shows, in one place, and the records of a step, an evaluation and a fit.

Slash keys as verl and TRL users know them: `train/...` for the training batch and its update,
`time/...` and `perf/...` for where time goes, `eval/...` for the held-out evaluation (the curve's
points), `fit/...` for the scaling-law fit. No `@` or spaces: every tracker takes them as they are.
The values are the ones the run's own files hold (history.jsonl, fit.json), not recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalerl.status.history import TrainSummary

# --- per training step ------------------------------------------------------------------------
TRAIN_REWARD = "train/reward"  # mean reward over every sample received for the step's batch
TRAIN_PASS_RATE = "train/pass_rate"
TRAIN_TRUNCATION = "train/truncation_rate"
TRAIN_POLICY_LAG = "train/policy_lag"
TRAIN_ENTROPY = "train/entropy"
TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_CLIP_FRACTION = "train/clip_fraction"
TRAIN_RATIO_MAX = "train/ratio_max"
TRAIN_LR = "train/lr"
TRAIN_STALE_GROUPS = "train/stale_groups"
TRAIN_ZERO_VARIANCE_GROUPS = "train/zero_variance_groups"
TRAIN_RECEIVED_GROUPS = "train/received_groups"
TRAIN_KEPT_GROUPS = "train/kept_groups"
TRAIN_TOKENS = "train/tokens"
TRAIN_LENGTH_MEAN = "train/response_length/mean"
TRAIN_LENGTH_MAX = "train/response_length/max"
TRAIN_COMPUTE = "train/compute"  # compute spent so far (GPU-hours; process-hours on CPU)
TRAIN_VERSION = "train/policy_version"
# Train-inference mismatch by policy lag (scalerl.recipe.mismatch): `train/mismatch/<figure>` at
# lag 0 (the engines' mismatch alone), `train/mismatch_lag<n>/<figure>` at lag n.
TRAIN_MISMATCH = "train/mismatch"
MISMATCH_FIGURES = ("kl", "abs_mean", "abs_max", "outside", "tokens")
TIME_STEP = "time/step_seconds"
TIME_SYNC = "time/sync_seconds"
PERF_TOKENS_PER_SECOND = "perf/tokens_per_second"

# --- per evaluation (history.jsonl's row) -------------------------------------------------------
EVAL_PASS_RATE = "eval/pass_rate"
EVAL_PASS_RATE_SE = "eval/pass_rate_se"
EVAL_COMPUTE = "eval/compute"
EVAL_PROMPTS = "eval/prompts"
EVAL_SAMPLES = "eval/samples"
EVAL_TRUNCATION = "eval/truncation_rate"
EVAL_UNSCORED = "eval/unscored"  # samples that could not be scored, counted as not passed
# history.jsonl's name -> the tracker's
EVAL_FIELDS = {
    "pass_rate": EVAL_PASS_RATE,
    "pass_rate_se": EVAL_PASS_RATE_SE,
    "compute": EVAL_COMPUTE,
    "eval_prompts": EVAL_PROMPTS,
    "eval_samples": EVAL_SAMPLES,
    "eval_truncation_rate": EVAL_TRUNCATION,
    "eval_unscored": EVAL_UNSCORED,
}

# --- per fit (fit.json) -------------------------------------------------------------------------
# fit.json's number -> the tracker's; intervals [lo, hi] become `<name>_low` and `<name>_high`.
FIT_FIELDS = {
    "A": "fit/A",
    "B": "fit/B",
    "C_mid": "fit/C_mid",
    "R0": "fit/R0",
    "A_atLeast": "fit/A_at_least",
    "points": "fit/points",
    "predictedAtBudget": "fit/predicted_at_budget",
}
FIT_INTERVALS = {
    "A_interval": "fit/A",
    "B_interval": "fit/B",
    "C_mid_interval": "fit/C_mid",
    "predictedAtBudgetInterval": "fit/predicted_at_budget",
}
FIT_TEXT = {"confidence": "fit/confidence"}  # words, not numbers: a tag, text or summary
FIT_CURVE = "fit/curve"  # the curve's plot (curve.png), where the tracker takes images


def step_metrics(
    train: TrainSummary,
    *,
    reward: float | None,
    lengths: list[int],
    received_groups: int,
    kept_groups: int,
    stale_groups: int,
    zero_variance_groups: int,
    tokens: int,
    lr: float | None,
    step_seconds: float | None,
    sync_seconds: float | None,
    compute: float,
    version: int,
) -> dict[str, float]:
    """One training step's record; what the step did not measure (no update: no loss) is left
    out rather than logged as 0."""
    values: dict[str, float | int | None] = {
        TRAIN_REWARD: reward,
        TRAIN_PASS_RATE: train.pass_rate,
        TRAIN_TRUNCATION: train.truncation_rate,
        TRAIN_POLICY_LAG: train.policy_lag,
        TRAIN_ENTROPY: train.entropy,
        TRAIN_LOSS: train.loss,
        TRAIN_GRAD_NORM: train.grad_norm,
        TRAIN_CLIP_FRACTION: train.clip_fraction,
        TRAIN_RATIO_MAX: train.ratio_max,
        TRAIN_LR: lr,
        TRAIN_STALE_GROUPS: stale_groups,
        TRAIN_ZERO_VARIANCE_GROUPS: zero_variance_groups,
        TRAIN_RECEIVED_GROUPS: received_groups,
        TRAIN_KEPT_GROUPS: kept_groups,
        TRAIN_TOKENS: tokens,
        TRAIN_LENGTH_MEAN: sum(lengths) / len(lengths) if lengths else None,
        TRAIN_LENGTH_MAX: max(lengths) if lengths else None,
        TRAIN_COMPUTE: compute,
        TRAIN_VERSION: version,
        TIME_STEP: step_seconds,
        TIME_SYNC: sync_seconds,
        PERF_TOKENS_PER_SECOND: tokens / step_seconds if step_seconds else None,
    }
    for lag, figures in train.mismatch_by_lag.items():
        prefix = TRAIN_MISMATCH if lag == "0" else f"{TRAIN_MISMATCH}_lag{lag}"
        values |= {f"{prefix}/{name}": figures[name] for name in MISMATCH_FIGURES}
    return {k: float(v) for k, v in values.items() if v is not None}


def eval_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """One evaluation's record, from its history.jsonl row."""
    return {name: float(row[key]) for key, name in EVAL_FIELDS.items() if row.get(key) is not None}


def fit_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """One fit's numbers, from fit.json's data (or status.prediction's)."""
    out = {name: float(report[key]) for key, name in FIT_FIELDS.items() if _number(report.get(key))}
    for key, name in FIT_INTERVALS.items():
        interval = report.get(key)
        if isinstance(interval, list | tuple) and len(interval) == 2:
            out[f"{name}_low"], out[f"{name}_high"] = float(interval[0]), float(interval[1])
    return out


def fit_text(report: Mapping[str, Any]) -> dict[str, str]:
    return {name: str(report[key]) for key, name in FIT_TEXT.items() if report.get(key)}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A spec as `a.b.c: value` strings (MLflow parameters); lists as their JSON-ish text."""
    out: dict[str, str] = {}
    for key, value in nested.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = "null" if value is None else str(value)
    return out
