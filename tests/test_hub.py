"""Models and data by Hugging Face Hub id (scalerl.hub), loaded through huggingface_hub's own
client from a Hub on 127.0.0.1 (tests/fake_hub.py) that HF_ENDPOINT points at."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from fake_hub import FakeHub
from hypothesis import given
from hypothesis import strategies as st

from scalerl import hub
from scalerl.errors import InputError, SpecError
from scalerl.generator.prompts import train_and_validation
from scalerl.hub import RunSources
from scalerl.local import resolve_paths
from scalerl.spec import parse_run

ROWS = [{"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)]


def jsonl(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows: list[dict[str, str]], path: Path) -> bytes:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


@pytest.fixture(name="fake")
def fake_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running fake Hub that the environment points at, with an empty cache and no token.
    huggingface_hub reads its own endpoint once, at import: it is pointed here too, so that
    nothing the library sends on its own (its agent registry) leaves the machine."""
    fake = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(
        huggingface_hub.constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agents.json")
    )
    yield fake
    fake.stop()


@pytest.fixture(name="demo_model", scope="module")
def demo_model_fixture() -> dict[str, bytes]:
    """The files of `builtin:demo`'s model folder: a real tiny Llama."""
    from scalerl.demo.builtins import resolve_builtin

    folder = resolve_builtin("builtin:demo")
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_model_by_id_is_its_commit_s_files(fake: FakeHub, demo_model: dict[str, bytes]) -> None:
    sha = fake.push("model", "acme/tiny-llama", demo_model)

    resolved = hub.resolve_model("hf://acme/tiny-llama")

    assert tree(Path(resolved.path)) == demo_model
    assert (resolved.commit, resolved.revision, resolved.repo) == (sha, "main", "acme/tiny-llama")
    assert Path(resolved.path).is_relative_to(Path(os.environ["HF_HOME"]) / "hub")
    assert f"commit {sha}" in resolved.line()


def test_a_model_loads_with_transformers_from_the_resolved_folder(
    fake: FakeHub, demo_model: dict[str, bytes]
) -> None:
    from transformers import AutoConfig

    fake.push("model", "acme/tiny-llama", demo_model)
    resolved = hub.resolve_model("hf://acme/tiny-llama")
    config = AutoConfig.from_pretrained(resolved.path)
    assert config.to_dict()["model_type"] == json.loads(demo_model["config.json"])["model_type"]


def spec_with(model: str, train: object, validation: object = None) -> dict[str, object]:
    data: dict[str, object] = {"train": train, "reward": "exact"}
    if validation is not None:
        data["validation"] = {"path": validation, "prompts": 3}
    return {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "hubrun"},
        "spec": {"model": {"path": model}, "data": data},
    }


def test_a_run_s_model_and_data_by_id_resolve_to_local_paths_and_load(
    fake: FakeHub, tmp_path: Path
) -> None:
    """data.train as a string reads the dataset's train split (two Parquet shards here) and
    data.validation.path its test split; every process gets local paths, the rows the files
    hold are the rows the run reads."""
    model_sha = fake.push("model", "acme/m", {"config.json": b"{}"})
    files = {
        "data/train-00000-of-00002.parquet": parquet(ROWS[:5], tmp_path / "a.parquet"),
        "data/train-00001-of-00002.parquet": parquet(ROWS[5:9], tmp_path / "b.parquet"),
        "data/test-00000-of-00001.jsonl": jsonl(ROWS[9:]),
        "README.md": b"# a dataset",
    }
    data_sha = fake.push("dataset", "acme/sums", files)
    sources = RunSources()

    run = resolve_paths(parse_run(spec_with("hf://acme/m", "hf://datasets/acme/sums", "hf://acme/sums")), sources)

    assert Path(run.spec.model.path).name == model_sha
    train, validation = train_and_validation(run.spec.data, seed=0)
    assert sorted(e.prompt for e in train) == sorted(r["prompt"] for r in ROWS[:9])
    assert [e.prompt for e in validation] == [r["prompt"] for r in ROWS[9:]]
    records = {r["field"]: r for r in sources.records()}
    assert records["data.train"]["commit"] == data_sha
    assert [Path(f).name for f in records["data.train"]["files"]] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    assert records["model.path"] == {
        "field": "model.path", "uri": "hf://acme/m", "kind": "model", "repo": "acme/m",
        "revision": "main", "commit": model_sha, "path": run.spec.model.path, "files": [],
        "split": None, "dataFiles": [],
    }  # fmt: skip


def test_split_and_data_files_select_a_source_s_files(fake: FakeHub) -> None:
    files = {
        "math/train.jsonl": jsonl(ROWS[:4]),
        "math/extra.jsonl": jsonl(ROWS[4:6]),
        "code/train.jsonl": jsonl(ROWS[6:8]),
        "math/eval.jsonl": jsonl(ROWS[8:]),
    }
    fake.push("dataset", "acme/mix", files)
    train = [
        {"path": "hf://datasets/acme/mix", "dataFiles": ["math/*.jsonl"], "domain": "math"},
        {"path": "hf://datasets/acme/mix/code", "split": "train", "domain": "code"},
    ]
    sources = RunSources()

    run = resolve_paths(parse_run(spec_with("builtin:demo", train)), sources)

    assert isinstance(run.spec.data.train, list)
    got = [(Path(s.path).relative_to(Path(s.path).parents[1]).as_posix(), s.domain) for s in run.spec.data.train]
    assert got == [
        ("math/eval.jsonl", "math"),
        ("math/extra.jsonl", "math"),
        ("math/train.jsonl", "math"),
        ("code/train.jsonl", "code"),
    ]
    assert [r["field"] for r in sources.records()] == ["data.train[0]", "data.train[1]"]


def test_a_source_with_no_files_of_its_split_names_the_fix(fake: FakeHub) -> None:
    fake.push("dataset", "acme/csv", {"train.csv": b"prompt,answer\n"})
    with pytest.raises(InputError, match=r"hf://datasets/acme/csv: no JSONL or Parquet file of split train .*dataFiles"):
        hub.resolve_dataset("hf://datasets/acme/csv")


def test_split_and_data_files_are_refused_on_a_local_file() -> None:
    with pytest.raises(SpecError, match="split and dataFiles select the files of a Hub dataset"):
        parse_run(spec_with("/m", [{"path": "/data/a.jsonl", "split": "train"}]))


def test_a_resumed_run_loads_the_commit_it_recorded_after_the_branch_moved(
    fake: FakeHub, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    first = fake.push("model", "acme/m", {"config.json": b'{"v": 1}'})
    fake.push("dataset", "acme/d", {"train.jsonl": jsonl(ROWS[:3])})
    spec = parse_run(spec_with("hf://acme/m@main", "hf://datasets/acme/d"))
    started = RunSources.of_run(out)
    resolve_paths(spec, started)
    started.write(out)

    moved = fake.push("model", "acme/m", {"config.json": b'{"v": 2}'})
    fake.push("dataset", "acme/d", {"train.jsonl": jsonl(ROWS[3:6])})
    resumed = resolve_paths(spec, RunSources.of_run(out))
    fresh = resolve_paths(spec, RunSources())

    assert json.loads((Path(resumed.spec.model.path) / "config.json").read_text()) == {"v": 1}
    assert Path(resumed.spec.model.path).name == first
    assert [e.prompt for e in train_and_validation(resumed.spec.data.model_copy(update={"validation": {"prompts": 1}}), 0)[0] + train_and_validation(resumed.spec.data.model_copy(update={"validation": {"prompts": 1}}), 0)[1]]
    assert Path(fresh.spec.model.path).name == moved
    recorded = json.loads((out / hub.SOURCES_FILE).read_text())["sources"]
    assert [r["commit"] for r in recorded if r["field"] == "model.path"] == [first]
