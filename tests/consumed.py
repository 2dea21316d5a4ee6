"""What runs trained on (`data.logConsumed`: consumed.jsonl), checked against the rule of
scalerl.rollout.position: within an epoch no prompt is taken twice and none is skipped; a group in
flight at a kill is served again in its epoch.

    spec = write_variant(..., {"data": {"train": small_train_set(tmp_path), "logConsumed": True}})
    ...
    assert_once_per_epoch(out)
"""

from __future__ import annotations

from pathlib import Path

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.status.history import read_jsonl


def small_train_set(tmp_path: Path, prompts: int = 24) -> str:
    """The first `prompts` of the demo's train set: a dozen steps go through several epochs."""
    lines = prepare_demo(default_cache_dir()).train_path.read_text().splitlines()[:prompts]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def batches(out: Path) -> list[dict]:
    rows = read_jsonl(out / "consumed.jsonl")
    assert [r["batch"] for r in rows] == list(range(len(rows)))  # each batch once, in order
    return rows


def taken(out: Path) -> list[tuple[str, int]]:
    """(prompt id, epoch) of every group a step took, in order."""
    return [(p["id"], p["epoch"]) for row in batches(out) for p in row["prompts"]]


def assert_once_per_epoch(out: Path) -> dict[str, list[int]]:
    """No prompt taken twice in an epoch; every epoch of every prompt up to its last taken, but
    for one group that may still have been in flight when the run ended while the same prompt's
    next epoch was taken (a hole a restart left would have been served first). Returns the
    epochs of each prompt."""
    pairs = taken(out)
    assert len(pairs) == len(set(pairs)), "a prompt taken twice in one epoch"
    epochs: dict[str, list[int]] = {}
    for prompt, epoch in pairs:
        epochs.setdefault(prompt, []).append(epoch)
    for prompt, seen in epochs.items():
        seen.sort()
        holes = sorted(set(range(seen[-1] + 1)) - set(seen))
        assert holes in ([], [seen[-1] - 1]), f"{prompt} skipped epochs {holes}: {seen}"
    return epochs
