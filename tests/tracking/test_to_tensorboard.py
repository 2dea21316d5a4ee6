"""TensorBoard's tracker on its own: what `log` returned from is on disk, so a kill loses nothing
the sink counts as delivered, and a resumed writer's purge step hides only the steps it redoes.
Read back with TensorBoard's own reader."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tracker_readers import tensorboard_events, tensorboard_series

from scalerl.spec import TensorboardTracking
from scalerl.tracking.records import Record, TrackedRun
from scalerl.tracking.to_tensorboard import TensorboardTracker


def tracker(run_dir: Path) -> TensorboardTracker:
    return TensorboardTracker(
        TensorboardTracking(), TrackedRun.of("math-8b", "local", run_dir, "trainer")
    )


def test_a_logged_record_is_in_the_file_before_the_writer_closes(tmp_path: Path) -> None:
    board = tracker(tmp_path)
    board.open(purge_step=None)
    for step in range(1, 4):
        board.log(Record("step", step, {"train/reward": step / 4}))
        events = tensorboard_events(board.logdir)
        assert tensorboard_series(events, "train/reward") == [
            (s, pytest.approx(s / 4)) for s in range(1, step + 1)
        ]
    board.close(finished=True)


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_to_tensorboard import tracker
from scalerl.tracking.records import Record
board = tracker(Path({run_dir!r}))
board.open(purge_step=None)
for step in range(1, 7):
    board.log(Record("step", step, {{"train/reward": step / 8}}))
    if step == 4:
        board.log(Record("eval", 4, {{"eval/pass_rate": 0.25}}))
os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush at exit
"""


def test_a_killed_writer_s_records_survive_and_the_resumed_one_redoes_after_its_purge_step(
    tmp_path: Path,
) -> None:
    script = KILLED_WRITER.format(tests=str(Path(__file__).parent), run_dir=str(tmp_path))
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The resumed attempt: its checkpoint is step 4, it writes steps 5 and 6 again.
    board = tracker(tmp_path)
    board.open(purge_step=5)
    for step in (5, 6):
        board.log(Record("step", step, {"train/reward": step / 10}))
    board.close(finished=True)

    events = tensorboard_events(board.logdir)
    assert tensorboard_series(events, "eval/pass_rate") == [(4, 0.25)]
    assert tensorboard_series(events, "train/reward") == [
        (1, 0.125),
        (2, 0.25),
        (3, 0.375),
        (4, 0.5),
        (5, pytest.approx(0.5)),
        (6, pytest.approx(0.6)),
    ]
    assert len(list(board.logdir.glob("events.*"))) == 2
