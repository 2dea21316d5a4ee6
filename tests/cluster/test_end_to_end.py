"""End to end on the real control plane, as a user would watch it: `helm install`, then
`kubectl apply -f examples/tiny-cluster.yaml` in a namespace that enforces `restricted` Pod
Security. The chart's operator Deployment runs from the operator's image, built with Podman from
this checkout (containers.py), as the chart says (UID 10001, read-only root, its ServiceAccount's
token); the operator makes the run's children; the real Job controller makes the pods; the test
kubelet runs the real `scalerl trainer` and `scalerl generator` (vLLM on CPU) processes; the
trainer reports evaluations into the run's status; fit Jobs run `scalerl fit --run` in the
operator's image too; `kubectl get srl` shows A and C_mid.

On the way: the generator's process is killed after the first evaluation, and then its
replacement's pod deleted: each time the generator alone is replaced, the trainer (whose only
generator it is) waiting for it without a gang restart, and the replacement joins the weight-sync
group and training goes on. Then the trainer's pod is deleted with `kubectl delete pod` (a
drain): the gang restarts from its checkpoint. The run is suspended and resumed; it ends
`Succeeded` at its budget with a complete, non-repeating history; `kubectl delete srl` leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import containers
import pytest
import yaml
from chart import CHART, RELEASE, RELEASE_NAMESPACE, helm
from controlplane import ControlPlane
from kubelet import Kubelet, printing_logs_on_failure

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.operator.manifests import Images
from scalerl.ports import free_port
from scalerl.status.history import read_history

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-cluster.yaml"
# The claim the example names; the kubelet's directory behind it holds models/, data/, runs/.
PVC = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scalerl-store}
spec: {accessModes: [ReadWriteMany], resources: {requests: {storage: 1Gi}}}
"""
FIRST_EVALUATION_S = 180.0  # vLLM's import and engine start on 2 loaded cores, then step 0
# The generator's first pod starts this late (an image pull on a fresh node), longer than the
# run's peer timeout, scaled down from 300 s: its peers wait for it within the startup timeout.
SLOW_START_S, PEER_TIMEOUT_S = 30.0, 20
RUN_S = 300.0
CHILD_KINDS = (
    "configmaps,services,serviceaccounts,secrets,jobs,pods,roles,rolebindings,networkpolicies"
)


def stage_demo(store: Path) -> None:
    """What a user copies onto the volume: the demo model at /models/demo, its data in /data."""
    assets = prepare_demo(default_cache_dir())
    shutil.copytree(assets.model_path, store / "models" / "demo")
    (store / "data").mkdir()
    shutil.copy(assets.train_path, store / "data" / "train.jsonl")
    shutil.copy(assets.validation_path, store / "data" / "val.jsonl")


def columns(table: str) -> dict[str, str]:
    """`kubectl get srl NAME`'s output as {column: cell}."""
    header, row = table.splitlines()
    return dict(zip(header.split(), row.split(), strict=True))


class Watch:
    """The run as `kubectl` shows it, and seconds since `kubectl apply` per milestone."""

    def __init__(self, plane: ControlPlane, ns: str, name: str) -> None:
        self.plane, self.ns, self.name = plane, ns, name
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.marks[what] = time.monotonic() - self.start

    def status(self) -> dict[str, Any]:
        code, run = self.plane.api(
            "GET", f"/apis/scalerl.dev/v1alpha1/namespaces/{self.ns}/scalerlruns/{self.name}"
        )
        return dict(run.get("status") or {}) if code == 200 else {}

    def step(self) -> int:
        return int((self.status().get("progress") or {}).get("step", -1))

    def pods(self, role: str, attempt: int | None = None) -> list[str]:
        """Names of the live pods of `role` (of gang `attempt`, or any)."""
        selector = f"scalerl.dev/run={self.name},scalerl.dev/role={role}"
        if attempt is not None:
            selector += f",scalerl.dev/attempt={attempt}"
        code, found = self.plane.api(
            "GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector={selector}"
        )
        assert code == 200, found
        return [
            p["metadata"]["name"]
            for p in found["items"]
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        ]

    def until(self, what: Callable[[], T | None], timeout_s: float, message: str) -> T:
        deadline = time.monotonic() + timeout_s
        while not (value := what()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s:.0f} s: {message}; {self.status()}")
            time.sleep(0.5)
        self.mark(message)
        return value

    def restarted(self, restarts: int, at_step: int, kubelet: Kubelet) -> None:
        """The gang restarts, its trainer resumes from a checkpoint and trains past `at_step`.
        (The status still shows the old gang's last step until the new one reports its own.)"""
        self.until(lambda: self.status().get("restarts") == restarts, 90, f"restart {restarts}")

        def resumed() -> bool:
            trainers = self.pods("trainer", attempt=restarts)
            return any("resumed from" in kubelet.log(pod) for pod in trainers)

        self.until(resumed, RUN_S, f"the trainer of gang attempt {restarts} resumed")
        self.until(lambda: self.step() > at_step, RUN_S, f"training after restart {restarts}")

    def replaced(self, count: int, kubelet: Kubelet) -> None:
        """The `count`th generator replacement: the Event, the trainer taking it into the
        weight-sync group, and a step trained after it, with no gang restart."""
        self.until(lambda: len(self.events("GeneratorReplaced")) == count, 90, f"replaced {count}")
        trainer = self.pods("trainer", attempt=0)[0]

        def joined() -> int:
            found = re.findall(r"generator 0 joins the weight-sync group at step (\d+)",
                               kubelet.log(trainer))  # fmt: skip
            return int(found[-1]) + 1 if len(found) == count else 0

        at_step = self.until(joined, RUN_S, f"replacement {count} joined") - 1
        self.until(lambda: self.step() > at_step, RUN_S, f"training after replacement {count}")
        assert self.status()["restarts"] == 0

    def events(self, reason: str) -> list[str]:
        """The messages of the run's Events of `reason`, oldest first."""
        code, found = self.plane.api("GET", f"/api/v1/namespaces/{self.ns}/events")
        assert code == 200, found
        events = sorted(found["items"], key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [e["message"] for e in events if e["reason"] == reason]


@pytest.mark.slow
def test_helm_install_then_kubectl_apply_to_a_prediction(
    plane: ControlPlane, ns: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    run = yaml.safe_load(EXAMPLE.read_text())
    run["spec"]["failurePolicy"]["peerTimeoutSeconds"] = PEER_TIMEOUT_S
    # Room past the trainer's deletion: the deleted trainer trains on until its SIGTERM lands
    # (the example's 20 steps take 2 s), and the status keeps the step it reached until the new
    # gang reports its own; with the budget reached meanwhile, nothing was left to train after
    # the suspension and the test waited for a step past the last.
    run["spec"]["budget"]["maxSteps"] = 40
    applied = tmp_path / EXAMPLE.name
    applied.write_text(yaml.safe_dump(run))
    name, spec = run["metadata"]["name"], run["spec"]
    every_eval, max_steps = spec["evaluation"]["everySteps"], spec["budget"]["maxSteps"]
    every_checkpoint = spec["checkpoint"]["everySteps"]
    image = containers.operator_image()
    images = {Images().fit: image}  # the chart's operator and the fit Jobs name the same image
    with (
        operator_only_for(plane, ns),
        Kubelet(plane, RELEASE_NAMESPACE, logs_dir=tmp_path / "system", images=images) as system,
    ):
        with (
            Kubelet(
                plane,
                ns,
                logs_dir=tmp_path / "logs",
                slow_starts={f"{name}-generator-0-": SLOW_START_S},
                images=images,
            ) as kubelet,
            printing_logs_on_failure(kubelet),
            printing_logs_on_failure(system),
        ):
            operator = wait_until(system.running, 120, "the operator's pod running")[0]
            assert system.in_image(operator) == image
            stage_demo(kubelet.claim_dir(spec["checkpoint"]["claimName"]))
            plane.kubectl("apply", "-n", ns, "-f", "-", input=PVC)
            watch = Watch(plane, ns, name)
            plane.kubectl("apply", "-n", ns, "-f", str(applied))
            watch.until(lambda: watch.status().get("phase") == "Starting", 30, "Starting")
            watch.until(lambda: watch.status().get("phase") == "Running", 90, "Running")
            # Running once the slow pod runs too, and no restart for its lateness.
            assert watch.marks["Running"] >= SLOW_START_S and watch.status()["restarts"] == 0
            # After the first evaluation the generator's process is killed (OOM, SIGKILL), then
            # its replacement's pod is deleted: each time its Job replaces it alone, and it joins
            # the running trainer (which cannot train on without it: the run waits for it).
            watch.until(lambda: watch.status().get("evaluations"), FIRST_EVALUATION_S, "eval")
            generator = watch.pods("generator", attempt=0)[0]
            os.kill(kubelet.pid(generator), signal.SIGKILL)
            watch.replaced(1, kubelet)
            deleted_generator = watch.pods("generator", attempt=0)[0]
            plane.kubectl("delete", "pod", deleted_generator, "-n", ns, "--wait=false")
            watch.replaced(2, kubelet)

            # Past a checkpoint, `kubectl delete pod` the trainer (a drain, a preemption): its
            # Job fails, the gang restarts from the checkpoint.
            watch.until(lambda: watch.step() > every_checkpoint + 1, RUN_S, "past a checkpoint")
            deleted_at = watch.step()
            trainer = watch.until(lambda: watch.pods("trainer"), 60, "the trainer running")[0]
            plane.kubectl("delete", "pod", trainer, "-n", ns, "--wait=false")
            watch.restarted(1, deleted_at, kubelet)

            # Suspend: the pods go, the run keeps its place; resume: it trains on from there.
            plane.kubectl("patch", "srl", name, "-n", ns, "--type=merge", "-p", SUSPEND)
            watch.until(lambda: watch.status().get("phase") == "Suspended", 60, "Suspended")
            watch.until(lambda: not kubelet.running(), 60, "every process stopped")
            suspended_at = watch.step()
            plane.kubectl("patch", "srl", name, "-n", ns, "--type=merge", "-p", RESUME)
            watch.until(lambda: watch.step() > suspended_at, RUN_S, "training after resume")

            watch.until(lambda: watch.status().get("phase") == "Succeeded", RUN_S, "Succeeded")
            final = watch.until(lambda: fitted_all(watch.status()), 90, "the last fit")
            table = plane.kubectl("get", "srl", name, "-n", ns)
            store = kubelet.claim_dir(spec["checkpoint"]["claimName"])
            history = read_history(store / "runs" / name / "history.jsonl")
            trainer_log = "".join(kubelet.log(p) for p in kubelet.ended if "-trainer-" in p)
            ended = dict(kubelet.ended)
            plane.kubectl("delete", "srl", name, "-n", ns, "--timeout=90s")
            watch.until(lambda: not children(plane, ns, name), 60, "every child collected")
            watch.until(lambda: not kubelet.running(), 60, "no process left")
            # The operator's Deployment scaled to 0: its pod gets SIGTERM, kopf stops cleanly.
            plane.kubectl("scale", "deployment", RELEASE, "-n", RELEASE_NAMESPACE, "--replicas=0")
            watch.until(lambda: not system.running(), 60, "the operator stopped")
    operator_log = system.log(operator)
    assert system.ended[operator] == 0, operator_log[-3000:]
    assert not [line for line in operator_log.splitlines() if "forbidden" in line.lower()]

    for what, seconds in watch.marks.items():
        print(f"kubectl apply -> {what}: {seconds:.1f} s")
    print(f"trainer pod deleted at step {deleted_at}")
    print(f"$ kubectl get srl {name}\n{table}")
    row = columns(table)
    expected = list(range(0, max_steps + 1, every_eval))
    # What `kubectl get srl` shows: the phase, the last step and the prediction.
    assert row["PHASE"] == "Succeeded" and int(row["STEP"]) == max_steps
    # Trainer 0's word on its generators, written where it writes its progress: whole again.
    degraded = {c["type"]: c for c in final["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("False", "GeneratorsReady")
    assert float(row["A"]) == pytest.approx(final["prediction"]["A"])
    assert float(row["C_MID"]) == pytest.approx(final["prediction"]["C_mid"])
    # PASSRATE is the last held-out evaluation (history.jsonl's pass_rate, to 6 digits).
    assert float(row["PASSRATE"]) == float(f"{history[-1]['pass_rate']:.6g}")
    # The evaluations: every one once, in order, although steps after a checkpoint ran again,
    # each the held-out pass rate and training compute the trainer recorded (0 at step 0).
    assert [e["step"] for e in final["evaluations"]] == expected
    assert [e["step"] for e in history] == expected
    assert [e["passRate"] for e in final["evaluations"]] == [
        float(f"{e['pass_rate']:.6g}") for e in history
    ]
    assert [e["samples"] for e in final["evaluations"]] == [e["eval_samples"] for e in history]
    computes = [e["computeHours"] for e in final["evaluations"]]
    assert computes == sorted(computes) and computes[0] == 0.0
    prediction = final["prediction"]
    assert prediction["points"] == len(expected) - 1  # trained evaluations: not the step-0 one
    assert 0.0 <= prediction["A"] <= 1.0 and prediction["C_mid"] > 0
    assert final["restarts"] == 1
    (restart,) = watch.events("GangRestart")
    assert trainer in restart or "trainer" in restart, restart
    assert final["generators"]["replaced"] == 2 and final["generators"]["desired"] == 1
    killed, deleted = watch.events("GeneratorReplaced")
    assert killed.startswith(f"pod {generator} failed: exit code 137")
    assert deleted.startswith(f"pod {deleted_generator} failed: exit code 143")  # SIGTERM
    # Each start after the first resumed from the newest checkpoint an earlier gang saved (the
    # trainers' logs in the order their pods ended). The status's step is no bound: it lags the
    # trainer, which may save one more checkpoint before it stops. A trainer stopped between
    # writing a checkpoint and logging it has its successor resume one interval past that line.
    saved, resumed = [0], []
    for kind, step in re.findall(r"(saved|resumed from) \S+ \(step (\d+)\)", trainer_log):
        if kind == "saved":
            saved.append(int(step))
        else:
            resumed.append(int(step))
            assert int(step) in (saved[-1], saved[-1] + every_checkpoint), (saved, resumed)
    assert len(resumed) == 2, resumed  # a restart and a resume
    # Pods as the kubelet ended them: the killed generator (SIGKILL: 137), the deleted one
    # (SIGTERM: 143, which fails its pod, so its Job replaces it), the deleted trainer (143, or
    # 0 if it stopped cleanly on it), every fit Job's pod.
    assert (ended[generator], ended[deleted_generator]) == (137, 143)
    assert ended[trainer] in (0, 143), ended[trainer]
    fits = {pod: code for pod, code in ended.items() if f"{name}-fit-" in pod}
    assert fits and set(fits.values()) == {0}, fits
    assert {kubelet.in_image(pod) for pod in fits} == {image}  # every fit ran in the image


SUSPEND = json.dumps({"spec": {"suspend": True}})
RESUME = json.dumps({"spec": {"suspend": False}})


@contextlib.contextmanager
def operator_only_for(plane: ControlPlane, ns: str) -> Iterator[None]:
    """`helm upgrade` of the release: its operator watches only this test's namespace (other
    tests' runs are theirs), on free ports of this machine (its pod shares the host's network).
    Rolled back after: the other tests run their operators as the chart's cluster-wide role."""
    done = helm(
        plane,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NAMESPACE,
        "--reuse-values",
        "--set",
        f"operator.watchNamespaces={{{ns}}}",
        "--set",
        f"operator.metricsPort={free_port()},operator.livenessPort={free_port()}",
    )
    assert done.returncode == 0, done.stderr

    def rolled_out() -> bool:  # only the new template's pod is left (Recreate: the old one goes)
        code, found = plane.api("GET", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods")
        assert code == 200, found
        args = [p["spec"]["containers"][0].get("args", []) for p in found["items"]]
        return len(args) == 1 and f"--namespace={ns}" in args[0]

    try:
        wait_until(rolled_out, 60, "the upgraded operator's pod")
        yield
    finally:
        back = helm(plane, "rollback", RELEASE, "-n", RELEASE_NAMESPACE)
        assert back.returncode == 0, back.stderr


def wait_until(what: Callable[[], T | None], timeout_s: float, message: str) -> T:
    deadline = time.monotonic() + timeout_s
    while not (value := what()):
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {message}"
        time.sleep(0.5)
    return value


def children(plane: ControlPlane, ns: str, name: str) -> list[str]:
    out = plane.kubectl("get", CHILD_KINDS, "-n", ns, "-l", f"scalerl.dev/run={name}", "-o", "name")
    return out.split()


def fitted_all(current: dict[str, Any]) -> dict[str, Any] | None:
    """The status once the last fit Job covered every evaluation."""
    prediction, count = current.get("prediction") or {}, current.get("evaluationCount")
    return current if count and prediction.get("evaluations") == count else None
