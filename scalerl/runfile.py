"""Variants of a run file: a ScaleRLRun YAML with parts of its spec changed, written where a
benchmark or a test runs it, and the command line of `scalerl run` for one."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def merge(into: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` merged into `into` (which is returned): mappings key by key, anything else
    replaced by a copy."""
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def write_variant(base: Path | Mapping[str, Any], path: Path, *changes: Mapping[str, Any]) -> Path:
    """Write to `path` the run of `base` (a run file, or one already read) with each of
    `changes`, in order, merged into its spec; returns `path`."""
    run: dict[str, Any] = (
        yaml.safe_load(base.read_text()) if isinstance(base, Path) else copy.deepcopy(dict(base))
    )
    spec = run.setdefault("spec", {})
    for change in changes:
        merge(spec, change)
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def run_command(path: Path, out: Path) -> list[str]:
    """`scalerl run` of the run file `path` into `out`, in this Python, without the live
    progress display."""
    return [
        sys.executable,
        "-m",
        "scalerl.cli",
        "run",
        str(path),
        "--out",
        str(out),
        "--no-progress",
    ]
