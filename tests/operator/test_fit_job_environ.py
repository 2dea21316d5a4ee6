"""The fit Job's pod, as the operator makes it, for a run that names trackers: it logs each fit to
them (scalerl.tracking.fit_job), so it gets what the trainer's pods get for that, the run's uid
(the tracker run's identity) and the tracking Secret's keys, and nothing without spec.tracking."""

from __future__ import annotations

from typing import Any

from scalerl.operator.manifests import Images, Owner, fit_job, workload
from scalerl.spec import parse_run
from scalerl.tracking import RUN_UID_ENV

OWNER = Owner("math-8b", "team-a", "0b5c-uid")


def run(spec: dict[str, Any]) -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "math-8b", "namespace": "team-a"},
            "spec": {"model": {"path": "/m"}, "data": {"train": "/d.jsonl"}, **spec},
        }
    )


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_fit_job_gets_the_run_uid_and_the_tracking_secret_as_the_trainer_does() -> None:
    tracked = run(
        {"tracking": {"mlflow": {"uri": "http://mlflow:5000"}, "secretRef": {"name": "k"}}}
    )
    fit = pod_of(fit_job(tracked, OWNER, 2, Images()))
    trainer = pod_of(workload(tracked, OWNER, "trainer", 0, Images()))
    assert fit["env"] == [{"name": RUN_UID_ENV, "value": "0b5c-uid"}]
    assert fit["envFrom"] == trainer["envFrom"] == [{"secretRef": {"name": "k"}}]
    assert fit["command"] == ["scalerl", "fit", "--run", "math-8b", "--namespace", "team-a"]


def test_a_fit_job_of_a_run_without_trackers_gets_neither() -> None:
    fit = pod_of(fit_job(run({}), OWNER, 1, Images()))
    assert "env" not in fit and "envFrom" not in fit
    secretless = run({"tracking": {"wandb": {"project": "rl"}}})
    fit = pod_of(fit_job(secretless, OWNER, 1, Images()))
    assert fit["env"] == [{"name": RUN_UID_ENV, "value": "0b5c-uid"}] and "envFrom" not in fit
