"""The initializer Job of a run with hf:// sources, and what its gang's pods get instead of ids.

job = initializer.job(run, owner, images)     # scalerl fetch-sources into the claim's hub/
pods_run = sources.localized(run, records)    # the spec the gang reads: local files
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
from hypothesis import given, settings
from hypothesis import strategies as st
from small_run import run_manifest

from scalerl.hub import TRAIN_SPLITS, Resolved, RunSources
from scalerl.operator import initializer, manifests, names, sources
from scalerl.operator.manifests import Images, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.runpaths import resolve_paths
from scalerl.spec import ScaleRLRun, parse_run

OWNER = Owner("r1", "research", "0b7c5a52-3f3e-4c0e-9d8e-5b1f0c2d9a11")
MODEL = "hf://org/model@v1"
DATA = "hf://datasets/org/prompts"
TOKEN = {"name": "hub-token", "key": "token"}


def hub_run(**spec: Any) -> ScaleRLRun:
    body = {"model": {"path": MODEL}, "data": {"train": DATA}, **spec}
    return parse_run(run_manifest("research", "r1", **body))


def container_of(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"]["containers"][0])


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_of(obj).get("env", [])}


def test_the_initializer_fetches_the_run_s_sources_into_the_claim_as_the_run() -> None:
    run = hub_run(hub={"tokenSecret": TOKEN, "endpoint": "https://mirror.example"})
    job = initializer.job(run, OWNER, Images())
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["name"] == "r1-initializer"
    assert job["metadata"]["labels"][names.LABEL_ROLE] == "initializer"
    assert job["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert container_of(job)["command"] == [
        "scalerl", "fetch-sources", "--spec", "/etc/scalerl/run.yaml",
        "--out", "/store/runs/r1", "--run", "r1", "--namespace", "research",
    ]  # fmt: skip
    assert container_of(job)["image"] == "scalerl/operator:0.1.0"
    assert pod["serviceAccountName"] == "r1-status"  # it writes status.sources
    assert {"name": "store", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert env_of(job) == {
        "HF_HUB_CACHE": "/store/hub",
        "HF_ENDPOINT": "https://mirror.example",
        "HF_TOKEN": {"secretKeyRef": TOKEN},
    }
    # The restricted profile, as every pod of the run.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container_of(job)["securityContext"] == manifests.CONTAINER_SECURITY
    kubernetes_validate.validate(job, "1.30.0", strict=True)


def test_the_token_reaches_the_initializer_alone() -> None:
    run = hub_run(hub={"tokenSecret": {"name": "hub-token"}})
    assert env_of(initializer.job(run, OWNER, Images()))["HF_TOKEN"] == {
        "secretKeyRef": {"name": "hub-token", "key": "HF_TOKEN"}  # the key's default
    }
    gang = manifests.workloads(run, OWNER, 0, Images())
    for obj in [*gang, manifests.fit_job(run, OWNER, 1, Images())]:
        assert "HF_TOKEN" not in env_of(obj) and "hub-token" not in str(obj)
    assert {
        o["kind"]
        for o in manifests.children(run, OWNER, 0, Images(), StreamKeys.generate())
        if "hub-token" in str(o)
    } == {"ConfigMap"}  # the spec names it; no pod mounts it


def test_the_gang_reads_the_claim_s_cache_offline() -> None:
    for obj in manifests.workloads(hub_run(), OWNER, 0, Images()):
        assert env_of(obj)["HF_HUB_OFFLINE"] == "1"
        assert env_of(obj)["HF_HUB_CACHE"] == "/store/hub"
        mount = {"name": "store", "mountPath": "/store/hub", "subPath": "hub", "readOnly": True}
        assert mount in container_of(obj)["volumeMounts"]
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_a_run_without_ids_has_no_initializer_and_no_cache() -> None:
    run = parse_run(run_manifest("research", "r1"))
    assert not sources.uses_hub(run) and sources.missing(run, []) == []
    for obj in manifests.workloads(run, OWNER, 0, Images()):
        assert "HF_HUB_OFFLINE" not in env_of(obj)
        assert all(m["mountPath"] != "/store/hub" for m in container_of(obj)["volumeMounts"])


def test_ids_without_a_claim_are_refused_with_the_fix() -> None:
    (problem,) = initializer.problems(hub_run(checkpoint={"claimName": None}))
    assert problem.startswith("spec.checkpoint.claimName: a run with hf:// sources needs a claim")
    assert initializer.problems(hub_run()) == []


def test_the_job_is_replaced_when_the_sources_change_not_the_budget() -> None:
    before = initializer.key(hub_run())
    assert initializer.key(hub_run(budget={"maxSteps": 700})) == before
    assert initializer.key(hub_run(model={"path": "hf://org/model@v2"})) != before
    assert initializer.key(hub_run(hub={"endpoint": "https://mirror.example"})) != before


def test_the_initializer_image_follows_the_fit_s_unless_named(monkeypatch: Any) -> None:
    from scalerl.operator.handlers import images_from_environ

    monkeypatch.setenv("SCALERL_FIT_IMAGE", "registry.example/operator:2")
    assert images_from_environ().initializer == "registry.example/operator:2"
    monkeypatch.setenv("SCALERL_INITIALIZER_IMAGE", "registry.example/hub:1")
    assert images_from_environ().initializer == "registry.example/hub:1"


# --- the gang's spec: the operator's substitution is `scalerl run`'s -----------------------------


class RecordingHub(RunSources):
    """Resolves every id to files named after it, as if the Hub held them: both sides of the
    comparison below see the same resolution, so what differs is the substitution alone."""

    def __init__(self, files_per_source: int) -> None:
        super().__init__()
        self.count = files_per_source

    def model(self, field: str, uri: str) -> str:
        path = f"/store/hub/models--{abs(hash(uri))}/snapshots/c0"
        self.resolved.append((field, Resolved(uri, "model", "org/m", "main", "c0", path)))
        return path

    def dataset(
        self,
        field: str,
        uri: str,
        split: str | None = None,
        data_files: Any = (),
        default_splits: Any = TRAIN_SPLITS,
    ) -> list[str]:
        folder = f"/store/hub/datasets--{abs(hash((field, uri)))}/snapshots/c1"
        files = tuple(f"{folder}/part-{i}.jsonl" for i in range(self.count))
        resolved = Resolved(
            uri, "dataset", "org/d", "main", "c1", folder, files, split, tuple(data_files)
        )
        self.resolved.append((field, resolved))
        return list(files)


LOCAL = "/data/local.jsonl"
source = st.fixed_dictionaries(
    {"path": st.sampled_from([DATA, "hf://datasets/org/other@v2", LOCAL])},
    optional={"reward": st.sampled_from(["math", "exact"]), "domain": st.just("math")},
).map(lambda s: s if s["path"] == LOCAL else {**s, "split": "train", "dataFiles": ["*.jsonl"]})
data_value = st.one_of(st.sampled_from([DATA, LOCAL]), st.lists(source, min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from([MODEL, "/models/base"]),
    train=data_value,
    validation=st.one_of(st.none(), data_value),
    files=st.integers(1, 3),
)
def test_the_gang_s_spec_is_what_scalerl_run_resolves_locally(
    model: str, train: Any, validation: Any, files: int
) -> None:
    data: dict[str, Any] = {"train": train}
    if validation is not None:
        data["validation"] = {"path": validation}
    run = parse_run(run_manifest("research", "r1", model={"path": model}, data=data))
    hub = RecordingHub(files)
    expected = resolve_paths(run, hub)  # local paths stay as they are: /data, /models are absolute
    records = hub.records()
    assert sources.missing(run, records) == []
    assert sources.missing(run, records[1:]) == sources.wanted(run)[:1] or not records
    assert sources.localized(run, records).spec == expected.spec


def test_the_config_map_names_the_local_files_once_recorded() -> None:
    run = hub_run()
    hub = RecordingHub(1)
    resolve_paths(run, hub)
    text = manifests.config_map(sources.localized(run, hub.records()), OWNER)["data"]["run.yaml"]
    assert "hf://" not in text
    assert f"path: {hub.records()[0]['path']}" in text
    assert Path(hub.records()[1]["files"][0]).name in text
