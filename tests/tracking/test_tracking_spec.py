"""`spec.tracking` as a user writes it: the trackers it names, the clear errors, and what the
operator gives the pods that log (the run's uid, the Secret's keys)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import InputError, SpecError
from scalerl.operator.manifests import Images, Owner, fit_job, workload
from scalerl.spec import TrackingSpec, parse_run
from scalerl.status.history import TrainSummary
from scalerl.tracking import RUN_UID_ENV, TrackedRun, build_trackers, names, open_trackers
from scalerl.tracking.fit_job import job_trackers

BLOCKS: dict[str, dict[str, Any]] = {
    "mlflow": {"uri": "http://mlflow.example:5000", "experiment": "rl"},
    "tensorboard": {"dir": "/logs/tb"},
    "wandb": {"project": "rl", "entity": "team", "mode": "offline"},
    "trackio": {"project": "rl"},
}


def manifest(tracking: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"path": "/m"}, "data": {"train": "/d.jsonl"}}
    if tracking is not None:
        spec["tracking"] = tracking
    return {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "math-8b", "namespace": "team-a"},
        "spec": spec,
    }


@given(st.sets(st.sampled_from(sorted(BLOCKS))))
def test_the_spec_holds_exactly_the_trackers_named(named: set[str]) -> None:
    run = parse_run(manifest({name: BLOCKS[name] for name in named}))
    assert run.spec.tracking is not None
    assert set(run.spec.tracking.trackers) == named
    again = parse_run(manifest(run.spec.tracking.model_dump(by_alias=True, exclude_none=True)))
    assert again.spec.tracking == run.spec.tracking


@pytest.mark.parametrize(
    ("tracking", "problem"),
    [
        ({"neptune": {}}, "spec.tracking.neptune: unknown field"),
        ({"wandb": {"projekt": "x"}}, "spec.tracking.wandb.projekt: unknown field"),
        ({"wandb": {"mode": "sometimes"}}, "spec.tracking.wandb.mode"),
        ({"secretRef": {"name": ""}}, "spec.tracking.secretRef.name"),
    ],
)
def test_a_tracking_block_a_user_mistyped_is_refused_by_name(
    tracking: dict[str, Any], problem: str
) -> None:
    with pytest.raises(SpecError) as err:
        parse_run(manifest(tracking))
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_a_run_without_tracking_opens_no_tracker(tmp_path: Path) -> None:
    assert open_trackers(parse_run(manifest(None)), tmp_path, "trainer", resume_step=0) is None
    assert open_trackers(parse_run(manifest({})), tmp_path, "trainer", resume_step=0) is None


def test_a_tracker_whose_library_is_missing_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "trackio", None)  # not installed (`make setup` leaves it out)
    spec = TrackingSpec.model_validate({"trackio": {"project": "rl"}})
    run = TrackedRun.of("math-8b", "local", tmp_path, "trainer")
    with pytest.raises(InputError, match=r"trackio \(pip install trackio\).*'trackio' is not"):
        build_trackers(spec, run)


def test_mlflow_without_a_uri_anywhere_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = TrackingSpec.model_validate({"mlflow": {}})
    run = TrackedRun.of("math-8b", "local", tmp_path, "trainer")
    with pytest.raises(InputError, match="no uri, and MLFLOW_TRACKING_URI is not set"):
        build_trackers(spec, run)


def test_the_tracker_run_is_the_same_for_every_process_and_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUN_UID_ENV, raising=False)
    trainer = TrackedRun.of("math-8b", "local", tmp_path / "run", "trainer")
    fit = TrackedRun.of("math-8b", "local", tmp_path / "x" / ".." / "run", "fit")
    other = TrackedRun.of("math-8b", "local", tmp_path / "elsewhere", "trainer")
    assert trainer.id == fit.id != other.id
    monkeypatch.setenv(RUN_UID_ENV, "0b5c-uid")  # on a cluster: the ScaleRLRun's uid
    assert TrackedRun.of("math-8b", "team-a", tmp_path, "trainer").id == "0b5c-uid"


def test_the_trainer_pod_gets_the_run_uid_and_the_secret_and_the_generator_does_not() -> None:
    owner, images = Owner("math-8b", "team-a", "0b5c-uid"), Images()
    tracked = parse_run(manifest({"wandb": {}, "secretRef": {"name": "tracker-keys"}}))
    trainer = _container(workload(tracked, owner, "trainer", 0, images))
    assert {"name": RUN_UID_ENV, "value": "0b5c-uid"} in trainer["env"]
    assert trainer["envFrom"] == [{"secretRef": {"name": "tracker-keys"}}]
    generator = _container(workload(tracked, owner, "generator", 0, images))
    assert "envFrom" not in generator
    assert RUN_UID_ENV not in {e["name"] for e in generator["env"]}
    fit = _container(fit_job(tracked, owner, 1, images))  # the fit Job's: tests/operator
    assert {"name": RUN_UID_ENV, "value": "0b5c-uid"} in fit["env"]
    untracked = _container(workload(parse_run(manifest(None)), owner, "trainer", 0, images))
    assert "envFrom" not in untracked
    assert RUN_UID_ENV not in {e["name"] for e in untracked["env"]}


def test_the_fit_job_logs_to_the_trackers_it_can_reach(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """TensorBoard's files belong to the trainer's folder; W&B offline needs the run's folder
    (tests/tracking/test_fit_job); a tracker whose library is not installed (here trackio: see
    trackio_venv.py) is left out by name, the others still get the fit."""
    spec = TrackingSpec.model_validate(BLOCKS)
    assert job_trackers(spec, tmp_path).trackers == ["mlflow", "wandb"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "not logged to tensorboard" in warned
    assert "not logged to trackio: trackio is not installed in this image" in warned
    assert job_trackers(spec).trackers == ["mlflow"]  # no folder for W&B's offline files


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_a_step_record_leaves_out_what_the_step_did_not_measure() -> None:
    record = names.step_metrics(
        TrainSummary(pass_rate=0.25, truncation_rate=0.0, policy_lag=None),
        reward=0.5,
        lengths=[3, 5, 10],
        received_groups=8,
        kept_groups=6,
        stale_groups=1,
        zero_variance_groups=1,
        tokens=300,
        lr=1e-6,
        step_seconds=2.0,
        sync_seconds=None,
        compute=0.01,
        version=4,
    )
    assert record[names.TRAIN_PASS_RATE] == 0.25
    assert record[names.TRAIN_LENGTH_MEAN] == 6.0 and record[names.TRAIN_LENGTH_MAX] == 10
    assert record[names.PERF_TOKENS_PER_SECOND] == 150.0
    for absent in (names.TRAIN_LOSS, names.TRAIN_ENTROPY, names.TRAIN_POLICY_LAG, names.TIME_SYNC):
        assert absent not in record


def test_a_fit_record_has_each_interval_as_low_and_high() -> None:
    report = {"A": 0.6, "A_interval": [0.55, 0.66], "B": 1.9, "B_interval": None, "points": 9}
    assert names.fit_metrics(report) == {
        "fit/A": 0.6,
        "fit/A_low": 0.55,
        "fit/A_high": 0.66,
        "fit/B": 1.9,
        "fit/points": 9.0,
    }
