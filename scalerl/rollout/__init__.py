"""Rollout records and the generator <-> trainer message channel (ZeroMQ + msgpack)."""

from scalerl.rollout.records import (
    Ack,
    EvalResult,
    Evaluate,
    Failure,
    GeneratorStats,
    Hello,
    Message,
    Ready,
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
    "Ack",
    "EvalResult",
    "Evaluate",
    "Failure",
    "GeneratorChannel",
    "GeneratorStats",
    "Hello",
    "Message",
    "Ready",
    "RolloutGroup",
    "Sample",
    "Start",
    "Stop",
    "TrainerChannel",
    "UpdateWeights",
    "decode",
    "encode",
]
