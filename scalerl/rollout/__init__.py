"""Rollout records and the generator <-> trainer message channel (ZeroMQ + msgpack)."""

from scalerl.rollout.records import (
    EvalResult,
    Evaluate,
    Failure,
    GeneratorStats,
    Hello,
    Message,
    MoreRollouts,
    RolloutGroup,
    Sample,
    Start,
    Stop,
    UpdateWeights,
    decode,
    encode,
)
from scalerl.rollout.stream import GeneratorChannel, TrainerChannel

__all__ = [
    "EvalResult",
    "Evaluate",
    "Failure",
    "GeneratorChannel",
    "GeneratorStats",
    "Hello",
    "Message",
    "MoreRollouts",
    "RolloutGroup",
    "Sample",
    "Start",
    "Stop",
    "TrainerChannel",
    "UpdateWeights",
    "decode",
    "encode",
]
