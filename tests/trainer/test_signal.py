"""No silent stall: a step with nothing to learn from is said at once, counted, set as a
condition, and after `failurePolicy.noSignalSteps` in a row the run stops with that message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.environment import ProcessEnv
from scalerl.errors import ScaleRLError
from scalerl.metrics import TrainerMetrics
from scalerl.spec import parse_run
from scalerl.status import FileStatus
from scalerl.sync.weights import SendStats
from scalerl.trainer.batch import BatchStats
from scalerl.trainer.history import TrainerState
from scalerl.trainer.main import Trainer

NOTHING = BatchStats(received_groups=16, all_wrong_groups=14, all_right_groups=2)
SOMETHING = BatchStats(received_groups=16, groups=3, all_wrong_groups=13)


def trainer(tmp_path: Path, no_signal_steps: int) -> Trainer:
    run = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "s"},
            "spec": {
                "model": {"path": "/m"},
                "data": {"train": "/t"},
                "failurePolicy": {"noSignalSteps": no_signal_steps},
            },
        }
    )
    env = ProcessEnv(tmp_path / "run.yaml", tmp_path, "127.0.0.1", 1, 2, 0, 1)
    parts = dict(
        policy=None, optimizer=None, scheduler=None, channel=None, clock=None, publisher=None
    )
    return Trainer(
        run,
        env,
        state=TrainerState(),
        status=FileStatus(tmp_path),
        metrics=TrainerMetrics("local", "s"),
        **parts,  # type: ignore[arg-type]
    )


def conditions(tmp_path: Path) -> dict[str, dict[str, str]]:
    data = json.loads((tmp_path / "status.json").read_text())
    return {c["type"]: c for c in data["conditions"]}


def test_a_step_without_signal_sets_the_condition_and_the_progress_line(tmp_path: Path) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    t.record_signal(NOTHING)
    message = "no learning signal: 14 of 16 groups all wrong, 2 all right"
    assert t.progress().no_signal == message
    assert conditions(tmp_path)["LearningSignal"]["status"] == "False"
    assert conditions(tmp_path)["LearningSignal"]["message"] == message
    assert t.metrics.no_signal_steps._value.get() == 1
    t.record_signal(SOMETHING)
    assert t.progress().no_signal is None
    assert conditions(tmp_path)["LearningSignal"]["status"] == "True"


def test_the_run_stops_after_no_signal_steps_in_a_row(tmp_path: Path) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    t.record_signal(NOTHING)
    t.record_signal(NOTHING)
    t.record_signal(SOMETHING)  # the streak resets
    t.record_signal(NOTHING)
    t.record_signal(NOTHING)
    with pytest.raises(ScaleRLError, match="3 steps in a row with no learning signal"):
        t.record_signal(NOTHING)
    stopped = conditions(tmp_path)["Stopped"]
    assert stopped["status"] == "True" and stopped["reason"] == "NoLearningSignal"


class Recorder:
    """Stands in for the channel and the weight sender: records what would go out."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def broadcast(self, message: object) -> None:
        self.sent.append(message)

    def send(self, to: object, what: object) -> SendStats | None:
        if isinstance(what, int):  # the sender's send(weights, version)
            self.sent.append(("weights", what))
            return SendStats(version=what, bytes=0, buckets=0, seconds=0.0)
        self.sent.append((to, what))  # the channel's send(generator, message)
        return None


def test_an_unchanged_policy_is_not_broadcast(tmp_path: Path) -> None:
    from scalerl.rollout.records import MoreRollouts, UpdateWeights
    from scalerl.trainer.publish import BroadcastPublisher

    t = trainer(tmp_path, no_signal_steps=3)
    wire = Recorder()
    publisher = BroadcastPublisher("127.0.0.1", 0, 1.0)
    t.channel = publisher.channel = publisher.sender = wire  # type: ignore[assignment]
    t.publisher = publisher
    publisher.members = [0, 2]
    t.policy = type("P", (), {"named_weights": lambda self: []})()  # type: ignore[assignment]
    t.broadcast_version = 0
    t.broadcast_weights()  # a step that learnt nothing: same version 0
    t.state.version = 1
    t.broadcast_weights()
    told = [(0, UpdateWeights(version=1)), (2, UpdateWeights(version=1))]
    assert wire.sent == [MoreRollouts(version=0), *told, ("weights", 1)]
