"""Checkpoints: save -> latest -> load restores everything; atomicity; pruning."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_signal import trainer
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from scalerl.errors import DataError, InputError
from scalerl.recipe import NoPositiveResampling
from scalerl.rollout.records import RolloutGroup
from scalerl.trainer import (
    Policy,
    StepSettings,
    build_batch,
    build_optimizer,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_policy,
    save_checkpoint,
    train_step,
)
from scalerl.trainer.checkpoint import OPTIMIZER_DIR
from scalerl.trainer.history import TrainerState

Trained = tuple[Policy, Optimizer, LRScheduler]


def fresh(model_dir: Path, dtype: str = "float32") -> Trained:
    policy = load_policy(model_dir, dtype=dtype, fp32_lm_head=True)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-15, warmup_steps=5
    )
    return policy, optimizer, scheduler


def trained(
    model_dir: Path, make_group: Callable[..., RolloutGroup], dtype: str = "float32"
) -> Trained:
    policy, optimizer, scheduler = fresh(model_dir, dtype)
    groups = [make_group([1.0, -1.0, 1.0], seed=1), make_group([-1.0, 1.0], seed=2)]
    batch, _ = build_batch(groups, current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    for _ in range(2):
        settings = StepSettings(
            "cispo", "prompt", epsilon_max=4.0, epsilon_low=0.2, epsilon_high=0.28
        )
        result = train_step(policy, optimizer, scheduler, batch, settings)
        assert not result.skipped
    return policy, optimizer, scheduler


def save(
    root: Path, step: int, run: Trained, state: dict[str, object] | None = None, **kw: int
) -> Path:
    policy, optimizer, scheduler = run
    return save_checkpoint(
        root,
        step,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state if state is not None else {"version": step},
        **kw,
    )


def assert_same_optimizer_state(a: Optimizer, b: Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for key, values in sa["state"].items():
        for name, value in values.items():
            assert torch.equal(sb["state"][key][name], value), (key, name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_save_latest_load_restores_everything(
    model_dir: Path,
    bf16_model_dir: Path,
    make_group: Callable[..., RolloutGroup],
    tmp_path: Path,
    dtype: str,
) -> None:
    source = bf16_model_dir if dtype == "bfloat16" else model_dir
    run = trained(source, make_group, dtype)
    state = {"version": 7, "history": [{"step": 1, "pass_rate": 0.5}], "counters": {"nan": 1}}
    saved = save(tmp_path, 2, run, state)
    assert saved == tmp_path / "step-000002" and latest_checkpoint(tmp_path) == saved
    policy, optimizer, scheduler = fresh(source, dtype)
    restored = load_checkpoint(saved, policy=policy, optimizer=optimizer, scheduler=scheduler)
    assert restored == {**state, "step": 2}
    for (name, a), b in zip(run[0].model.named_parameters(), policy.parameters(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert policy.head.weight.dtype == torch.float32
    assert_same_optimizer_state(run[1], optimizer)
    assert scheduler.state_dict() == run[2].state_dict()
    assert optimizer.param_groups[0]["lr"] == run[1].param_groups[0]["lr"]


def test_checkpoint_directory_is_a_loadable_model(
    model_dir: Path, make_group: Callable[..., RolloutGroup], tmp_path: Path
) -> None:
    run = trained(model_dir, make_group)
    saved = save(tmp_path, 5, run)
    again = load_policy(saved, fp32_lm_head=True)
    for a, b in zip(run[0].parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert json.loads((saved / "state.json").read_text()) == {"version": 5, "step": 5}


def test_leftover_temp_and_incomplete_directories_are_ignored(
    model_dir: Path, tmp_path: Path
) -> None:
    run = fresh(model_dir)
    good = save(tmp_path, 3, run)
    (tmp_path / ".tmp-step-000009-deadbeef").mkdir()  # a save that crashed mid-way
    (tmp_path / "step-000008").mkdir()  # no state.json: not a finished checkpoint
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == good
    assert [step for step, _ in list_checkpoints(tmp_path)] == [3]


def test_keep_prunes_the_oldest_checkpoints(model_dir: Path, tmp_path: Path) -> None:
    run = fresh(model_dir)
    for step in (1, 2, 3, 10):
        save(tmp_path, step, run, keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [3, 10]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_saving_the_same_step_again_replaces_it(model_dir: Path, tmp_path: Path) -> None:
    run = fresh(model_dir)
    save(tmp_path, 4, run, {"version": 1})
    saved = save(tmp_path, 4, run, {"version": 2})
    assert json.loads((saved / "state.json").read_text())["version"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["step-000004"]


def test_no_checkpoint_yet(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None


def test_loading_an_incomplete_checkpoint_raises_data_error(
    model_dir: Path, tmp_path: Path
) -> None:
    policy, optimizer, scheduler = fresh(model_dir)
    with pytest.raises(DataError, match="step-000001"):
        load_checkpoint(
            tmp_path / "step-000001", policy=policy, optimizer=optimizer, scheduler=scheduler
        )


def test_keep_must_be_positive(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="keep"):
        save(tmp_path, 1, fresh(model_dir), keep=0)


def test_a_damaged_optimizer_state_is_a_data_error_naming_the_checkpoint(
    model_dir: Path, make_group: Callable[..., RolloutGroup], tmp_path: Path
) -> None:
    saved = save(tmp_path, 2, trained(model_dir, make_group))
    (saved / OPTIMIZER_DIR / ".metadata").unlink()
    policy, optimizer, scheduler = fresh(model_dir)
    with pytest.raises(DataError, match="optimizer state in checkpoint .*step-000002"):
        load_checkpoint(saved, policy=policy, optimizer=optimizer, scheduler=scheduler)


def test_a_checkpoint_with_a_curriculum_per_generator_resumes_with_their_union() -> None:
    shard_0, shard_1 = NoPositiveResampling(), NoPositiveResampling()
    shard_0.observe("a", 1.0)
    shard_1.observe("b", 0.5)
    saved = {"step": 4, "curricula": {"0": shard_0.state_dict(), "1": shard_1.state_dict()}}
    resumed = NoPositiveResampling()
    resumed.load_state_dict(TrainerState.from_dict(saved).curriculum)
    assert resumed.filter(["a", "b", "c"]) == ["b", "c"]
    assert resumed.last_pass_rate("b") == 0.5


def test_the_run_s_end_right_after_a_checkpoint_saves_no_second_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    saved: list[int] = []
    monkeypatch.setattr(t, "save", lambda: saved.append(t.state.step))
    t.state.step = 40
    t.checkpoint()  # the periodic one at step 40
    t.checkpoint()  # the run's end at step 40: the same state
    assert saved == [40]
    t.state.evaluations.append({"step": 40, "pass_rate": 0.5})
    t.checkpoint()  # an evaluation since: saved again
    t.state.step = 41
    t.checkpoint()
    assert saved == [40, 40, 41]
