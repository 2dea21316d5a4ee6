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
from huggingface_hub.utils import _detect_agent
from hypothesis import given
from hypothesis import strategies as st

from scalerl import hub
from scalerl.errors import InputError, SpecError
from scalerl.generator.prompts import train_and_validation
from scalerl.hub import RunSources
from scalerl.runpaths import resolve_paths
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
    huggingface_hub fetches a registry of its own once per process from the endpoint it read
    at import: it is given an empty one, so that nothing leaves the machine."""
    fake = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(_detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY)
    yield fake
    fake.stop()


@pytest.fixture(name="demo_model", scope="module")
def demo_model_fixture() -> dict[str, bytes]:
    """The files of `builtin:demo`'s model folder: a real tiny Llama."""
    from scalerl.demo.builtins import resolve_builtin

    folder = resolve_builtin("builtin:demo")
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


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

    run = resolve_paths(
        parse_run(spec_with("hf://acme/m", "hf://datasets/acme/sums", "hf://acme/sums")), sources
    )

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
    got = [
        (Path(s.path).relative_to(Path(s.path).parents[1]).as_posix(), s.domain)
        for s in run.spec.data.train
    ]
    assert got == [
        ("math/eval.jsonl", "math"),
        ("math/extra.jsonl", "math"),
        ("math/train.jsonl", "math"),
        ("code/train.jsonl", "code"),
    ]
    assert [r["field"] for r in sources.records()] == ["data.train[0]", "data.train[1]"]


def test_a_source_with_no_files_of_its_split_names_the_fix(fake: FakeHub) -> None:
    fake.push("dataset", "acme/csv", {"train.csv": b"prompt,answer\n"})
    with pytest.raises(
        InputError,
        match=r"hf://datasets/acme/csv: no JSONL or Parquet file of split train .*dataFiles",
    ):
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
    assert Path(str(resumed.spec.data.train)).read_bytes() == jsonl(ROWS[:3])
    assert Path(str(fresh.spec.data.train)).read_bytes() == jsonl(ROWS[3:6])
    assert Path(fresh.spec.model.path).name == moved
    recorded = json.loads((out / hub.SOURCES_FILE).read_text())["sources"]
    assert [r["commit"] for r in recorded if r["field"] == "model.path"] == [first]


def test_offline_with_a_filled_cache_needs_no_server(
    fake: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = fake.push("model", "acme/m", {"config.json": b"{}", "model.safetensors": b"w" * 64})
    fake.push("dataset", "acme/d", {"data/train.jsonl": jsonl(ROWS)})
    online = (hub.resolve_model("hf://acme/m"), hub.resolve_dataset("hf://datasets/acme/d"))
    fake.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    served = len(fake.requests)

    offline = (hub.resolve_model("hf://acme/m"), hub.resolve_dataset("hf://datasets/acme/d"))
    pinned = hub.resolve_model("hf://acme/m", pinned=sha)

    assert offline == online
    assert pinned.commit == sha and pinned.path == online[0].path
    assert len(fake.requests) == served  # not one request


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fails_fast(call: object, pattern: str) -> None:
    """`call()` raises one InputError line matching `pattern`, within a few seconds."""
    started = time.monotonic()
    with pytest.raises(InputError, match=pattern) as raised:
        call()  # type: ignore[operator]
    assert time.monotonic() - started < 5
    assert "\n" not in str(raised.value)


def test_each_failure_is_one_clear_line_within_seconds(
    fake: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.push("model", "acme/private", {"config.json": b"{}"})
    fake.repos[("model", "acme/private")].access = "private"
    fake.push("model", "acme/gated", {"config.json": b"{}"})
    fake.repos[("model", "acme/gated")].access = "gated"

    fails_fast(
        lambda: hub.resolve_model("hf://acme/missing"),
        r"^hf://acme/missing: no such repository on http://127\.0\.0\.1:\d+, or it is private "
        r"or gated \(set HF_TOKEN if private\)$",
    )
    fails_fast(
        lambda: hub.resolve_model("hf://acme/private"),
        r"^hf://acme/private: no such repository .*\(set HF_TOKEN if private\)$",
    )
    fails_fast(
        lambda: hub.resolve_model("hf://acme/gated"),
        r"^hf://acme/gated: gated on .*accept its conditions on the Hub and set HF_TOKEN",
    )
    fails_fast(
        lambda: hub.resolve_model("hf://acme/private@v9"), r"acme/private@v9: no such repository"
    )
    fake.push("model", "acme/public", {"config.json": b"{}"})
    fails_fast(
        lambda: hub.resolve_model("hf://acme/public@v9"), r"^hf://acme/public@v9: no such revision"
    )
    fake.rate_limited = True
    fails_fast(
        lambda: hub.resolve_model("hf://acme/public"),
        r"^hf://acme/public: rate limited by http://127\.0\.0\.1:\d+ \(429\); wait and retry",
    )
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    fails_fast(
        lambda: hub.resolve_model("hf://acme/public"),
        r"^hf://acme/public: cannot reach http://127\.0\.0\.1:\d+ \(ConnectError\); check the "
        r"network or HF_ENDPOINT",
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fails_fast(
        lambda: hub.resolve_dataset("hf://datasets/acme/never"),
        r"^hf://datasets/acme/never: not in the cache \(.*/hf/hub\) and HF_HUB_OFFLINE=1",
    )


def test_hf_token_reads_a_private_repo(fake: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    sha = fake.push("model", "acme/private", {"config.json": b"{}"})
    fake.repos[("model", "acme/private")].access = "private"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    fails_fast(
        lambda: hub.resolve_model("hf://acme/private"),
        r"^hf://acme/private: http://127\.0\.0\.1:\d+ refused HF_TOKEN "
        r"\(401: invalid or expired\); set a valid one or unset it$",
    )
    monkeypatch.setenv("HF_TOKEN", fake.token)

    assert hub.resolve_model("hf://acme/private").commit == sha
    assert {auth for _, path, auth in fake.requests if "acme/private" in path} >= {
        f"Bearer {fake.token}"
    }


# --- the grammar --------------------------------------------------------------------------------

NAME = st.from_regex(r"[a-z0-9]{1,8}(-[a-z0-9]{1,8}){0,2}", fullmatch=True)
REVISION = st.one_of(
    st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True),
    st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
    st.integers(1, 999).map(lambda n: f"refs/pr/{n}"),
)
IN_REPO = st.lists(NAME, max_size=3).map("/".join)


@given(NAME, NAME, st.none() | REVISION, IN_REPO, st.sampled_from(["", "datasets/"]))
def test_well_formed_ids_parse_to_their_parts(
    org: str, name: str, revision: str | None, path: str, prefix: str
) -> None:
    uri = (
        f"hf://{prefix}{org}/{name}"
        + (f"@{revision}" if revision else "")
        + (f"/{path}" if path else "")
    )
    kind = "dataset" if prefix else "model"

    ref = hub.parse(uri, kind)

    assert (ref.kind, ref.repo_id, ref.revision, ref.path_in_repo) == (
        kind,
        f"{org}/{name}",
        revision,
        path,
    )
    if not prefix:  # Kubeflow's form: a bare id in a data field is a dataset
        assert hub.parse(uri, "dataset").kind == "dataset"


@given(
    st.one_of(
        st.from_regex(r"hf://[a-z0-9-]{0,12}", fullmatch=True),  # no org/name
        st.builds(lambda a, b: f"hf://{a}--{b}/x", NAME, NAME),  # '--' in a repo id
        st.builds(lambda a, b: f"hf://{a}/{b}@", NAME, NAME),  # an empty revision
        st.builds(lambda a, b: f"hf://datasets/{a}/{b}", NAME, NAME),  # data where a model is
        st.builds(lambda a, b: f"hf://spaces/{a}/{b}", NAME, NAME),  # a Space
        st.builds(lambda a, b: f"{a}/{b}", NAME, NAME),  # no hf://
    )
)
def test_malformed_ids_are_one_clear_line(uri: str) -> None:
    with pytest.raises(InputError) as raised:
        hub.parse(uri, "model")
    message = str(raised.value)
    assert message.startswith(repr(uri) if not uri.startswith("hf://") else uri)
    assert "\n" not in message


# --- the CLI ------------------------------------------------------------------------------------


def cli(*commands: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """`scalerl COMMAND...` for each command, run at once, each in a process of its own."""
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "scalerl.cli", *command],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    done = []
    for proc, command in zip(running, commands, strict=True):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    return done


def test_validate_checks_ids_and_deep_resolves_them(fake: FakeHub, tmp_path: Path) -> None:
    """In a process of its own, which reads HF_ENDPOINT and HF_HOME as a user's does."""
    fake.push("model", "acme/m", {"config.json": b"{}"})
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(spec_with("hf://acme/m", "hf://datasets/acme/missing")))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec_with("hf://datasets/acme/m", "hf://acme/d")))
    env = {"HF_ENDPOINT": fake.url, "HF_HOME": os.environ["HF_HOME"]}

    shallow, deep, malformed = cli(
        ["validate", str(spec)], ["validate", "--deep", str(spec)], ["validate", str(bad)], env=env
    )

    assert shallow.returncode == 0, shallow.stderr
    assert (deep.returncode, deep.stderr.strip().splitlines()[-1]) == (
        2,
        f"error: hf://datasets/acme/missing: no such repository on {fake.url}, or it is "
        "private or gated (set HF_TOKEN if private)",
    )
    assert malformed.returncode == 2
    assert (
        "error: spec.model.path: hf://datasets/acme/m: a dataset id where a model is wanted"
        in malformed.stderr
    )


# --- scalerl run and scalerl evaluate -----------------------------------------------------------


@pytest.fixture(name="demo_data", scope="module")
def demo_data_fixture() -> dict[str, bytes]:
    """`builtin:demo`'s prompts, as a dataset repo lays out its splits."""
    from scalerl.demo.builtins import resolve_builtin

    return {
        "train.jsonl": resolve_builtin("builtin:demo/train").read_bytes(),
        "validation.jsonl": resolve_builtin("builtin:demo/validation").read_bytes(),
    }


def law_history(out: Path) -> None:
    """history.jsonl of 11 evaluations of a run heading for A = 0.5 (enough for a fit)."""
    from scalerl.fit import sigmoid
    from scalerl.status.history import HeldOut, HistoryRow, PromptScore, TrainSummary

    rows = []
    for step in range(0, 101, 10):
        compute = 0.071 * step / 100
        correct = round(8 * float(sigmoid(compute, 0.5, 1.7, 0.02, 0.1)))
        scores = [PromptScore(f"val/{i}", 8, correct, 0) for i in range(32)]
        row = HistoryRow.of(
            step=step, version=step, compute=compute, time=1.7e9 + 4.0 * step,
            held_out=HeldOut.of(scores), train=TrainSummary(), counters={}, trainer_seconds={},
            generation={},
        )  # fmt: skip
        rows.append(json.dumps(row.to_dict()) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.jsonl").write_text("".join(rows))


def test_scalerl_run_prints_records_and_predicts_about_the_commits_it_resolved(
    fake: FakeHub,
    demo_model: dict[str, bytes],
    demo_data: dict[str, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """run_local resolves (and preflight checks the downloaded model and data) before the gang
    starts; the gang is replaced here by a recorded history, which the last fit reads."""
    from scalerl import local
    from scalerl.spec import load_run

    model_sha = fake.push("model", "acme/tiny-llama", demo_model)
    data_sha = fake.push("dataset", "acme/arith", demo_data)
    spec = yaml.safe_load((Path(local.__file__).parents[1] / "examples/local.yaml").read_text())
    spec["spec"]["model"]["path"] = "hf://acme/tiny-llama"
    spec["spec"]["data"]["train"] = "hf://datasets/acme/arith"
    spec["spec"]["data"]["validation"]["path"] = "hf://datasets/acme/arith"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "run"
    law_history(out)

    started: list[local.ScaleRLRun] = []  # the run as the gang would get it

    def execute(self: local.LocalRun) -> dict[str, object] | None:
        started.append(self.run)
        return self.refit(local.read_history(self.out / "history.jsonl"), ended=True)

    monkeypatch.setattr(local.LocalRun, "execute", execute)
    end = local.run_local(load_run(tmp_path / "run.yaml"), out, display=False)

    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" = commit ")[0] for line in lines] == [
        "hf://acme/tiny-llama: model acme/tiny-llama@main",
        "hf://datasets/acme/arith: dataset acme/arith@main",
        "hf://datasets/acme/arith: dataset acme/arith@main",
    ]
    recorded = json.loads((out / hub.SOURCES_FILE).read_text())["sources"]
    assert [(r["field"], r["commit"]) for r in recorded] == [
        ("model.path", model_sha),
        ("data.train", data_sha),
        ("data.validation.path", data_sha),
    ]
    assert [Path(r["files"][0]).name for r in recorded[1:]] == ["train.jsonl", "validation.jsonl"]
    assert end.report is not None and end.report["sources"] == recorded
    assert json.loads((out / "fit.json").read_text())["sources"] == recorded
    assert started[0].spec.model.path == recorded[0]["path"]
    assert started[0].spec.data.train == recorded[1]["files"][0]


def test_scalerl_evaluate_loads_a_checkpoint_by_id(
    fake: FakeHub, demo_model: dict[str, bytes]
) -> None:
    from scalerl.hfeval import load_model

    fake.push("model", "acme/tiny-llama", demo_model)
    model = load_model("hf://acme/tiny-llama")
    assert (
        model.config.to_dict()["model_type"] == json.loads(demo_model["config.json"])["model_type"]
    )


def test_a_hub_that_never_answers_fails_in_the_timeout(
    fake: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts the connection and says nothing: the API call's timeout ends it."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the kernel's backlog; nothing ever answers
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(hub, "TIMEOUT_S", 1.0)
    try:
        fails_fast(
            lambda: hub.resolve_model("hf://acme/m"), r"^hf://acme/m: cannot reach .*Timeout"
        )
    finally:
        silent.close()


def test_a_recorded_commit_gone_from_the_hub_says_how_to_start_over(fake: FakeHub) -> None:
    fake.push("model", "acme/m", {"config.json": b"{}"})
    gone = "0" * 40
    fails_fast(
        lambda: hub.resolve_model("hf://acme/m@main", pinned=gone),
        rf"^hf://acme/m@main: commit {gone}, recorded in the run's sources.json, is not on "
        r"http://127\.0\.0\.1:\d+ any more; remove sources.json to resolve the revision again$",
    )


def test_hf_hub_cache_says_where_the_snapshots_go(
    fake: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "shared-cache"))
    fake.push("model", "acme/m", {"config.json": b"{}"})
    resolved = hub.resolve_model("hf://acme/m")
    expected = tmp_path / "shared-cache" / "models--acme--m" / "snapshots" / resolved.commit
    assert Path(resolved.path) == expected


@pytest.mark.slow
def test_a_run_trains_a_model_and_data_loaded_by_id(
    fake: FakeHub, demo_model: dict[str, bytes], demo_data: dict[str, bytes], tmp_path: Path
) -> None:
    """`scalerl run` end to end, colocated (one process: the trainer and a vLLM engine on CPU),
    3 steps of the demo recipe shrunk, with the model and the prompts by id from the fake Hub."""
    from scalerl.runfile import run_command, write_variant
    from scalerl.status.history import read_history

    model_sha = fake.push("model", "acme/tiny-llama", demo_model)
    data_sha = fake.push("dataset", "acme/arith", demo_data)
    small = {
        "model": {"path": "hf://acme/tiny-llama"},
        "data": {
            "train": "hf://datasets/acme/arith",
            "validation": {"path": "hf://datasets/acme/arith", "prompts": 16},
        },
        "recipe": {
            "batch": {"prompts": 8, "generationsPerPrompt": 4},
            "optimizer": {"warmupSteps": 1},
        },
        "evaluation": {"everySteps": 1, "generationsPerPrompt": 2},
        "budget": {"maxSteps": 3},
        "checkpoint": {"everySteps": 3},
        "fit": {"everyEvaluations": 2, "minCompute": 0},
    }
    examples = Path(hub.__file__).resolve().parents[1] / "examples"
    spec = write_variant(examples / "colocated.yaml", tmp_path / "run.yaml", small)
    out = tmp_path / "run"

    done = subprocess.run(
        run_command(spec, out), capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"hf://acme/tiny-llama: model acme/tiny-llama@main = commit {model_sha}" in done.stdout
    assert [e["step"] for e in read_history(out / "history.jsonl")] == [0, 1, 2, 3]
    recorded = json.loads((out / hub.SOURCES_FILE).read_text())["sources"]
    assert [r["commit"] for r in recorded] == [model_sha, data_sha, data_sha]
    ran = yaml.safe_load((out / "run.yaml").read_text())["spec"]  # what the process read
    assert ran["model"]["path"] == recorded[0]["path"]
    gets = [path for method, path, _ in fake.requests if method == "GET" and "/resolve/" in path]
    assert len(gets) == len(set(gets)) == len(demo_model) + 2  # each file downloaded once
