"""A run whose model and data are Hub ids, on the real control plane: the operator's initializer
Job downloads them once into the run's claim (from tests/fake_hub.py, a Hub in its URL layout,
listening where the pods reach the API server), before any gang pod exists; the gang reads the
local files offline; a second run of the same commits downloads nothing; a failed download
leaves the run Initializing with the reason and no trainer or generator pod.

The runs ask for GPUs, which the test kubelet's node has none of: their gang pods are created but
stay Pending, so no training process runs (the gang's spec and pods are what is checked here;
tests/test_hub.py trains on ids locally).
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import in_thread
from controlplane import ControlPlane
from fake_hub import FakeHub
from kubelet import Kubelet, printing_logs_on_failure
from runs import RUNS, delete_run, ensure_crd, wait_for
from small_run import run_manifest

from scalerl.operator import names

MODEL, DATA, MISSING = "hf://acme/tiny", "hf://datasets/acme/prompts", "hf://acme/nope"
CLAIM = "store"
PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": CLAIM},
    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
}
ROWS = "".join(
    json.dumps({"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)
)
DOWNLOAD_S = 90.0  # a pod's start (imports) and the download, on a loaded 2-core machine


@pytest.fixture(name="hub")
def hub_fixture(
    plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeHub]:
    """The fake Hub, on the API server's address (the one address every pod reaches), holding a
    model and a dataset. The pods inherit this process's environment: no token, a fresh home."""
    hub = FakeHub(host=urllib.parse.urlsplit(plane.url).hostname or "127.0.0.1").start()
    hub.push("model", "acme/tiny", {"config.json": b"{}", "weights.safetensors": b"w" * 4096})
    hub.push("dataset", "acme/prompts", {"data/train.jsonl": ROWS.encode()})
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home-hf"))
    for name in ("HF_TOKEN", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    yield hub
    hub.stop()


def hub_run(ns: str, name: str, hub: FakeHub, model: str = MODEL) -> dict[str, Any]:
    return run_manifest(
        ns,
        name,
        model={"path": model},
        data={"train": DATA},
        checkpoint={"claimName": CLAIM},
        hub={"endpoint": hub.url},
    )


@contextlib.contextmanager
def operating(plane: ControlPlane, ns: str, kubeconfig: Path) -> Iterator[Kubelet]:
    """The CRD, the run's claim, the operator watching `ns` and a kubelet running its pods."""
    ensure_crd(plane)
    plane.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(PVC))
    with (
        in_thread(plane, kubeconfig, [ns]),
        Kubelet(plane, ns) as kubelet,
        printing_logs_on_failure(kubelet),
    ):
        yield kubelet


def create(plane: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    code, made = plane.api("POST", f"{RUNS}/{ns}/scalerlruns", body)
    assert code == 201, made


def status(plane: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    code, run = plane.api("GET", f"{RUNS}/{ns}/scalerlruns/{name}")
    assert code == 200, run
    return dict(run.get("status") or {})


def phase_is(plane: ControlPlane, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    now = status(plane, ns, name)
    return now if now.get("phase") == phase else None


def pods(plane: ControlPlane, ns: str, run: str) -> list[dict[str, Any]]:
    return listed(plane, f"/api/v1/namespaces/{ns}/pods", run)


def jobs(plane: ControlPlane, ns: str, run: str) -> list[dict[str, Any]]:
    return listed(plane, f"/apis/batch/v1/namespaces/{ns}/jobs", run)


def listed(plane: ControlPlane, collection: str, run: str) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"{names.LABEL_RUN}={run}")
    code, found = plane.api("GET", f"{collection}?labelSelector={selector}")
    assert code == 200, found
    return list(found["items"])


def roles(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["labels"][names.LABEL_ROLE] for o in objs)


def events(plane: ControlPlane, ns: str, name: str) -> dict[str, list[str]]:
    code, found = plane.api("GET", f"/api/v1/namespaces/{ns}/events")
    assert code == 200, found
    out: dict[str, list[str]] = {}
    for event in found["items"]:
        if event["involvedObject"].get("name") == name:
            out.setdefault(event["reason"], []).append(event["message"])
    return out


def test_the_initializer_downloads_once_and_the_gang_reads_the_files_offline(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path, hub: FakeHub
) -> None:
    with operating(plane, ns, operator_kubeconfig) as kubelet:
        store = kubelet.claim_dir(CLAIM)
        create(plane, ns, hub_run(ns, "first", hub))
        initializing = wait_for(
            lambda: phase_is(plane, ns, "first", "Initializing"), "Initializing"
        )
        assert initializing["message"].startswith(f"downloading {MODEL}, {DATA} into claim store")
        assert roles(pods(plane, ns, "first")) in ([], ["initializer"])
        started = wait_for(lambda: phase_is(plane, ns, "first", "Starting"), "Starting", DOWNLOAD_S)
        downloaded = hub.downloads()
        assert downloaded == 3  # config.json, weights.safetensors, data/train.jsonl

        # status.sources and the run directory's sources.json: the commits the Hub named.
        commits = {r["uri"]: r["commit"] for r in started["sources"]}
        assert commits == {
            u: hub.repos[k].refs["main"]
            for u, k in ((MODEL, ("model", "acme/tiny")), (DATA, ("dataset", "acme/prompts")))
        }
        recorded = json.loads((store / "runs" / "first" / "sources.json").read_text())
        assert recorded["sources"] == started["sources"]
        ready = {c["type"]: c for c in started["conditions"]}["SourcesReady"]
        assert (ready["status"], ready["reason"]) == ("True", "Downloaded")

        # The gang: its spec names the files in the claim's cache, its pods run offline.
        code, config = plane.api("GET", f"/api/v1/namespaces/{ns}/configmaps/first-config")
        spec = yaml.safe_load(config["data"]["run.yaml"])["spec"]
        model_dir = Path(spec["model"]["path"])
        assert (
            model_dir.is_relative_to(store / "hub")
            and (model_dir / "config.json").read_bytes() == b"{}"
        )
        assert Path(spec["data"]["train"]).read_text() == ROWS
        made = jobs(plane, ns, "first")
        assert roles(made) == ["generator", "initializer", "trainer"]
        for job in made:
            env = {
                e["name"]: e.get("value")
                for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
            }
            gang = job["metadata"]["labels"][names.LABEL_ROLE] != "initializer"
            assert (env.get("HF_HUB_OFFLINE") == "1") == gang
        wait_for(
            lambda: roles(pods(plane, ns, "first")).count("generator") == 2,
            "the gang's pods",
        )
        said = events(plane, ns, "first")
        assert said["Initializing"] and said["Initialized"] == [
            "; ".join(
                f"{r['field']}: {r['uri']} = commit {r['commit']}" for r in started["sources"]
            )
        ]

        # A second run of the same commits: its initializer finds them in the claim's cache.
        create(plane, ns, hub_run(ns, "second", hub))
        second = wait_for(
            lambda: phase_is(plane, ns, "second", "Starting"), "second Starting", DOWNLOAD_S
        )
        assert hub.downloads() == downloaded
        assert [r["commit"] for r in second["sources"]] == [r["commit"] for r in started["sources"]]
        for run in ("first", "second"):  # while the operator runs: it removes their finalizers
            delete_run(plane, ns, run)


def test_a_failed_download_leaves_the_run_initializing_with_no_gang(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path, hub: FakeHub
) -> None:
    with operating(plane, ns, operator_kubeconfig):
        create(plane, ns, hub_run(ns, "lost", hub, model=MISSING))
        why = f"{MISSING}: no such repository on {hub.url}, or it is private or gated"

        def failed() -> dict[str, Any] | None:
            now = phase_is(plane, ns, "lost", "Initializing")
            return now if now and now["message"].startswith(why) else None

        said = wait_for(failed, "Initializing with the download's error", DOWNLOAD_S)
        assert "\n" not in said["message"]
        assert "DownloadFailed" in events(plane, ns, "lost")
        assert roles(pods(plane, ns, "lost")) == ["initializer"] * len(pods(plane, ns, "lost"))
        assert roles(jobs(plane, ns, "lost")) == ["initializer"]
        assert hub.downloads() == 0
        delete_run(plane, ns, "lost")
