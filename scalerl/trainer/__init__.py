"""The trainer's parts: the policy model, batch building, one optimizer step, the optimizer and
checkpoints. The trainer process loop composes them; this package never imports kopf or vLLM.
"""

from scalerl.trainer.batch import Batch, BatchStats, build_batch
from scalerl.trainer.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from scalerl.trainer.optim import LinearWarmup, build_optimizer
from scalerl.trainer.policy import Policy, load_policy
from scalerl.trainer.step import StepResult, StepSettings, train_step

__all__ = [
    "Batch",
    "BatchStats",
    "LinearWarmup",
    "Policy",
    "StepResult",
    "StepSettings",
    "build_batch",
    "build_optimizer",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
    "train_step",
]
