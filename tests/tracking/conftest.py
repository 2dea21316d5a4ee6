"""Every tracking test keeps W&B's own files (settings, caches, its service's logs) in its
temporary folder, not the user's home."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
