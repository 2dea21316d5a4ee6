"""The ScaleRL recipe: advantages, policy losses, loss aggregation, effective-batch filters,
the No-Positive-Resampling curriculum, forced length interruption, token entropy, the sampling
filters' log-probs, and train-inference mismatch (its figures and its corrections).

Pure functions and small state objects over torch tensors; depends only on torch, the standard
library and `scalerl.errors`. Formulas follow the paper (arXiv 2510.13786); each module's
docstring states them and every choice the paper leaves open.
"""

from scalerl.recipe.advantages import NORMALIZERS, Normalization, compute_advantages
from scalerl.recipe.aggregation import AGGREGATIONS, AggregationMode, aggregate, masked_mean
from scalerl.recipe.correction import Correction
from scalerl.recipe.curriculum import NoPositiveResampling, pass_rate
from scalerl.recipe.entropy import token_entropy
from scalerl.recipe.filters import effective_sample_mask, zero_variance_groups
from scalerl.recipe.interruption import InterruptionPlan, completion_loss_mask, splice
from scalerl.recipe.losses import (
    LOSSES,
    ClipRange,
    LossFunction,
    LossName,
    TokenLosses,
    compute_policy_loss,
    loss_function,
)
from scalerl.recipe.sampling import SamplingFilters, filtered_logprobs, kept_tokens

__all__ = [
    "AGGREGATIONS",
    "LOSSES",
    "NORMALIZERS",
    "AggregationMode",
    "ClipRange",
    "Correction",
    "InterruptionPlan",
    "LossFunction",
    "LossName",
    "NoPositiveResampling",
    "Normalization",
    "SamplingFilters",
    "TokenLosses",
    "aggregate",
    "completion_loss_mask",
    "compute_advantages",
    "compute_policy_loss",
    "effective_sample_mask",
    "filtered_logprobs",
    "kept_tokens",
    "loss_function",
    "masked_mean",
    "pass_rate",
    "splice",
    "token_entropy",
    "zero_variance_groups",
]
