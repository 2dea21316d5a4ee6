"""The colocated process's weight publisher: each version is loaded into the in-process engine,
then the generator is told to sample on; a training step takes the device from the engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from scalerl.colocated import InMemoryPublisher
from scalerl.generator.colocation import Colocation
from scalerl.rollout.records import MoreRollouts
from scalerl.trainer.publish import Published


class Recorder:
    """Stands in for the engine and the channel: records what reached them, in order."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def load_in_memory(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        self.seen.append(("loaded", [name for name, _ in weights], version))
        return 0.25

    def broadcast(self, message: object) -> None:
        self.seen.append(message)


def test_a_published_version_is_loaded_in_memory_then_announced() -> None:
    wire = Recorder()
    colocation = Colocation()
    colocation.ready(wire)
    publisher = InMemoryPublisher(colocation, timeout_s=1.0)
    publisher.start(wire, generators=1)  # type: ignore[arg-type]
    policy: Any = type("P", (), {"named_weights": lambda self: iter([("w", torch.ones(1))])})()
    policy.adapter = None
    assert publisher.publish(policy, 3) == Published(seconds=0.25, bytes=4)  # one float32
    assert wire.seen == [("loaded", ["w"], 3), MoreRollouts(version=3)]


def test_a_step_holds_the_device_only_when_it_is_exclusive() -> None:
    exclusive = InMemoryPublisher(Colocation(exclusive=True), timeout_s=1.0)
    with exclusive.device():
        assert exclusive.colocation.turnstile._wanted.is_set()
    shared = InMemoryPublisher(Colocation(exclusive=False), timeout_s=1.0)
    with shared.device():
        assert not shared.colocation.turnstile._wanted.is_set()


def test_a_generator_that_cannot_be_built_fails_the_run_at_once(tmp_path: Any) -> None:
    """The engine thread's build raises (here: no model folder) before the generator runs: the
    trainer hears a Failure naming why, rather than waiting out its peer timeout."""
    from scalerl.colocated import _engine_thread
    from scalerl.environment import ProcessEnv
    from scalerl.metrics import GeneratorMetrics
    from scalerl.rollout.pipe import pipe
    from scalerl.rollout.records import Failure
    from scalerl.spec import parse_run

    run = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "broken"},
            "spec": {"model": {"path": str(tmp_path / "nowhere")}, "data": {"train": "t.jsonl"}},
        }
    )
    env = ProcessEnv(tmp_path / "run.yaml", tmp_path, "127.0.0.1", 0, 0, 0, 1)
    trainer, generator = pipe()
    _engine_thread(run, env, generator, GeneratorMetrics("ns", "broken"), Colocation())  # type: ignore[arg-type]
    received = trainer.recv(timeout_s=1)
    assert received is not None
    _, message = received
    assert isinstance(message, Failure) and "nowhere" in message.message
