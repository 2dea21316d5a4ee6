"""What W&B's offline files of earlier attempts hold (`scalerl.tracking.wandb_offline`): a second
attempt started within the same second as the first writes to `<folder>-1`, which counts; another
run's folder (`<id>-fit`) does not."""

from __future__ import annotations

import shutil
from pathlib import Path

import wandb

from scalerl.tracking.wandb_offline import last_step, offline_folders

RUN_ID = "0123456789abcdef"


def offline_run(run_dir: Path, run_id: str, steps: range) -> Path:
    """A real W&B offline run of `run_id` logging `steps`; its folder."""
    handle = wandb.init(
        id=run_id, mode="offline", dir=str(run_dir), settings=wandb.Settings(console="off")
    )
    for step in steps:
        handle.log({"train/reward": float(step)}, step=step)
    handle.finish()
    # W&B's writer is a service process of its own: finish() can return before it has written
    # the run's file (under load, a copy taken then held the 7-byte header alone). teardown()
    # waits for the service to exit, the file written whole.
    wandb.teardown()
    (folder,) = [f for f in (run_dir / "wandb").glob(f"offline-run-*-{run_id}") if f.is_dir()]
    return folder


def test_an_attempt_started_in_the_same_second_counts_and_another_run_does_not(
    tmp_path: Path,
) -> None:
    written = offline_run(tmp_path / "a", RUN_ID, range(1, 4))
    other = offline_run(tmp_path / "b", f"{RUN_ID}-fit", range(1, 10))
    wandb_dir = tmp_path / "run" / "wandb"
    wandb_dir.mkdir(parents=True)
    # The first attempt, killed before W&B wrote a record: its file holds the header only.
    first = wandb_dir / f"offline-run-20261202_162858-{RUN_ID}"
    first.mkdir()
    header = (written / f"run-{RUN_ID}.wandb").read_bytes()[:7]
    (first / f"run-{RUN_ID}.wandb").write_bytes(header)
    # The second, started within the same second: W&B added "-1" to the name.
    second = wandb_dir / f"{first.name}-1"
    shutil.copytree(written, second)
    shutil.copytree(other, wandb_dir / f"offline-run-20261202_162859-{RUN_ID}-fit")

    assert offline_folders(tmp_path / "run", RUN_ID) == [first, second]
    assert last_step(tmp_path / "run", RUN_ID) == 3
    assert last_step(tmp_path / "run", f"{RUN_ID}-fit") == 9
