"""End to end in the emulated cluster: `kubectl apply -f examples/tiny-cluster.yaml` and a tiny CPU
run goes all the way, as a user would watch it: the operator (kopf) makes the gang, the test
kubelet runs the real `scalerl trainer` and `scalerl generator` (vLLM on CPU) processes of its pods,
the trainer reports evaluations into the run's status, fit Jobs run `scalerl fit --run` the same
way, and `kubectl get srl` shows A and C_mid. On the way one pod's process is killed: the gang
restarts from its checkpoint and the run still ends with a complete, non-repeating history.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import NS, JobController, operator, pods, status
from kubelet import Kubelet, printing_logs_on_failure

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.status.history import read_history

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-cluster.yaml"
CRD = ROOT / "crds" / "scalerlruns.scalerl.dev.yaml"
# The claim the example names; the kubelet's directory behind it holds models/, data/, runs/.
PVC = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scalerl-store}
spec: {accessModes: [ReadWriteMany], resources: {requests: {storage: 1Gi}}}
"""
FIRST_EVALUATION_S = 150.0  # vLLM's import and engine start on 2 loaded cores, then step 0
RUN_S = 240.0


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


def step(k8s: Any, name: str) -> int:
    return int((status(k8s, name).get("progress") or {}).get("step", -1))


class Clock:
    """Seconds since `kubectl apply`, per milestone."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.marks[what] = time.monotonic() - self.start


@pytest.mark.slow
def test_kubectl_apply_to_a_prediction_through_a_gang_restart(k8s: Any, tmp_path: Path) -> None:
    run = yaml.safe_load(EXAMPLE.read_text())
    name, spec = run["metadata"]["name"], run["spec"]
    every_eval, max_steps = spec["evaluation"]["everySteps"], spec["budget"]["maxSteps"]
    every_checkpoint = spec["checkpoint"]["everySteps"]
    k8s.kubectl("apply", "-f", str(CRD))
    with (
        Kubelet(k8s, logs_dir=tmp_path / "logs") as kubelet,
        printing_logs_on_failure(kubelet),
        JobController(k8s),
        operator(k8s),
    ):
        store = kubelet.claim_dir(NS, spec["checkpoint"]["claimName"])
        stage_demo(store)
        k8s.kubectl("apply", "-f", "-", input=PVC)
        clock = Clock()
        k8s.kubectl("apply", "-f", str(EXAMPLE))
        k8s.wait_for(lambda: status(k8s, name).get("phase") == "Running", 60, "Running")
        clock.mark("Running")
        k8s.wait_for(lambda: status(k8s, name).get("evaluations"), FIRST_EVALUATION_S, "eval")
        clock.mark("first evaluation")

        # Past the first checkpoint, kill one pod's process: the whole gang restarts from it.
        k8s.wait_for(lambda: step(k8s, name) > every_checkpoint + 1, RUN_S, "past a checkpoint")
        killed_at = step(k8s, name)
        generator = pods(k8s, name, "generator")[0]["metadata"]["name"]
        os.kill(kubelet.pid(generator), signal.SIGKILL)
        clock.mark("generator killed")
        k8s.wait_for(lambda: status(k8s, name).get("restarts") == 1, 60, "a gang restart")
        k8s.wait_for(lambda: step(k8s, name) > killed_at, RUN_S, "training resumed")
        clock.mark("training resumed")

        k8s.wait_for(lambda: status(k8s, name).get("phase") == "Succeeded", RUN_S, "Succeeded")
        clock.mark("Succeeded")
        final = k8s.wait_for(lambda: fitted_all(status(k8s, name)), 60, "the last fit")
        clock.mark("prediction of every evaluation")
        table = k8s.kubectl("get", "srl", name).stdout
        history = read_history(store / "runs" / name / "history.jsonl")
        trainer_log = "".join(kubelet.log(p) for p in kubelet.ended if "-trainer-" in p)
    assert not kubelet.leftovers()  # the kubelet's exit checked it too, with a report

    for what, seconds in clock.marks.items():
        print(f"kubectl apply -> {what}: {seconds:.1f} s")
    print(f"generator killed at step {killed_at}\n$ kubectl get srl {name}\n{table}")
    row = columns(table)
    expected = list(range(0, max_steps + 1, every_eval))
    # What `kubectl get srl` shows: the phase, the last step and the prediction.
    assert row["PHASE"] == "Succeeded" and int(row["STEP"]) == max_steps
    assert float(row["A"]) == pytest.approx(final["prediction"]["A"])
    assert float(row["C_MID"]) == pytest.approx(final["prediction"]["C_mid"])
    # PASSRATE is the last held-out evaluation (history.jsonl's pass_rate, to 6 digits).
    assert float(row["PASSRATE"]) == float(f"{history[-1]['pass_rate']:.6g}")
    # The evaluations: every one once, in order, although steps after a checkpoint ran twice,
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
    assert prediction["points"] == len(expected)
    assert 0.0 <= prediction["A"] <= 1.0 and prediction["C_mid"] > 0
    assert final["restarts"] == 1
    restarts = [e["message"] for e in k8s.objects("events", NS) if e["reason"] == "GangRestart"]
    assert len(restarts) == 1 and f"pod {generator} failed: exit code 137" in restarts[0]
    resumed = [int(s) for s in re.findall(r"resumed from \S+ \(step (\d+)\)", trainer_log)]
    assert len(resumed) == 1 and resumed[0] % every_checkpoint == 0 and resumed[0] < killed_at
    # Pods as the kubelet ended them: the killed generator (SIGKILL: 137), every fit Job's pod.
    assert kubelet.ended[generator] == 137
    fits = {pod: code for pod, code in kubelet.ended.items() if f"{name}-fit-" in pod}
    assert fits and set(fits.values()) == {0}, fits


def fitted_all(current: dict[str, Any]) -> dict[str, Any] | None:
    """The status once the last fit Job covered every evaluation."""
    prediction, count = current.get("prediction") or {}, current.get("evaluationCount")
    return current if count and prediction.get("points") == count else None
