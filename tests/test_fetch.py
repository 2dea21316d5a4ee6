"""`scalerl fetch-sources`, the initializer Job's command, on this machine: a run's hf:// ids
resolved and downloaded into HF_HUB_CACHE from the fake Hub, recorded in the run directory.

    scalerl fetch-sources --spec run.yaml --out runs/r1 [--run r1 --namespace research]
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fake_hub import FakeHub
from test_hub import fake_fixture  # noqa: F401 - the fake Hub the environment points at

from scalerl.cli import main
from scalerl.hub import SOURCES_FILE

ROWS = b'{"id": "q1", "prompt": "1+1=", "answer": "2"}\n'


def spec_file(tmp_path: Path, model: str, train: str) -> Path:
    path = tmp_path / "run.yaml"
    run = {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "r1"},
        "spec": {"model": {"path": model}, "data": {"train": train}},
    }
    path.write_text(yaml.safe_dump(run))
    return path


def test_sources_are_downloaded_once_and_recorded(
    fake: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = fake.push("model", "acme/m", {"config.json": b"{}"})
    data = fake.push("dataset", "acme/d", {"train.jsonl": ROWS})
    spec, out = spec_file(tmp_path, "hf://acme/m", "hf://datasets/acme/d"), tmp_path / "runs" / "r1"

    assert main(["fetch-sources", "--spec", str(spec), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"hf://acme/m: model acme/m@main = commit {model} (")
    assert lines[1].startswith(f"hf://datasets/acme/d: dataset acme/d@main = commit {data} (")
    records = json.loads((out / SOURCES_FILE).read_text())["sources"]
    assert [(r["field"], r["commit"]) for r in records] == [
        ("model.path", model),
        ("data.train", data),
    ]
    assert Path(records[1]["files"][0]).read_bytes() == ROWS
    assert fake.downloads() == 2

    # Again, after the branch moved: the recorded commit, from the cache, nothing downloaded.
    fake.push("model", "acme/m", {"config.json": b'{"moved": true}'})
    assert main(["fetch-sources", "--spec", str(spec), "--out", str(out)]) == 0
    assert json.loads((out / SOURCES_FILE).read_text())["sources"] == records
    assert fake.downloads() == 2


def test_a_source_that_cannot_be_read_is_one_line_and_exit_2(
    fake: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_file(tmp_path, "hf://acme/gone", "/data/train.jsonl")
    assert main(["fetch-sources", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err.strip()
    assert said == (
        f"error: hf://acme/gone: no such repository on {fake.url}, or it is private or gated "
        "(set HF_TOKEN if private)"
    )
    assert not (tmp_path / "out" / SOURCES_FILE).exists()


def test_run_and_namespace_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_file(tmp_path, "/models/m", "/data/train.jsonl")
    assert main(["fetch-sources", "--spec", str(spec), "--out", str(tmp_path), "--run", "r1"]) == 2
    assert "--run and --namespace go together" in capsys.readouterr().err
