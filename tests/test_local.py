"""End to end: `scalerl run` with one trainer and two real vLLM generators on CPU, in-flight weight
updates, a trainer killed with SIGKILL mid-run, and the resume from its checkpoint."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from consumed import assert_once_per_epoch, small_train_set
from safetensors import safe_open

from scalerl.cli import main
from scalerl.local import Interrupted, LocalRun, PredictedStop, RunEnd
from scalerl.runfile import run_command, write_variant
from scalerl.spec import load_run
from scalerl.status.history import read_history
from scalerl.trainer.profile import PHASES

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# The demo recipe, shrunk so the whole test takes a couple of minutes on 2 cores.
SMALL = {
    "recipe": {"batch": {"prompts": 8, "generationsPerPrompt": 4}},
    "data": {"validation": {"prompts": 32}},
    "evaluation": {"everySteps": 4, "generationsPerPrompt": 2},
    "budget": {"maxSteps": 12},
    "checkpoint": {"everySteps": 2},
    "fit": {"everyEvaluations": 2},
}


def write_spec(tmp_path: Path, example: str = "local.yaml", **overrides: dict) -> Path:
    return write_variant(EXAMPLES / example, tmp_path / "run.yaml", SMALL, overrides)


def start_run(spec: Path, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SCALERL_PEER_TIMEOUT": "120"}
    return subprocess.Popen(
        run_command(spec, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@contextmanager
def running(spec: Path, out: Path) -> Iterator[subprocess.Popen[str]]:
    """`scalerl run` in the background; killed if the test leaves it running."""
    proc = start_run(spec, out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def finish(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The run's output once it ended, which it must have done successfully."""
    output, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, output
    return output


def wait_for_step(out: Path, step: int, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if json.loads((out / "progress.json").read_text())["step"] >= step:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"run did not reach step {step} within {timeout_s} s")


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def run_ports(processes: dict[str, dict[str, object]]) -> list[int]:
    """The rollout stream and sync store of trainer 0 (from its environment), every /metrics."""
    environ = Path(f"/proc/{processes['trainer-0']['pid']}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    ports = [int(env["SCALERL_CHANNEL_PORT"]), int(env["SCALERL_SYNC_PORT"])]
    return ports + [
        int(str(p["metrics"]).rsplit(":", 1)[1].split("/")[0]) for p in processes.values()
    ]


def listening_hosts(port: int) -> set[str]:
    """Addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                hosts.add(_address(address))
    return hosts


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # per-word little endian
    return socket.inet_ntop(socket.AF_INET6, words)


def wait_for_resume(out: Path, proc: subprocess.Popen[str], timeout_s: float) -> int:
    """The step the restarted trainer resumed from, once it has (its log says so)."""
    log = out / "logs" / "trainer-0.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        found = re.search(r"resumed from \S+ \(step (\d+)\)", log.read_text())
        if found:
            return int(found.group(1))
        time.sleep(0.5)
    raise AssertionError(f"the trainer did not resume within {timeout_s} s")


def kill(out: Path, role: str) -> None:
    process = json.loads((out / "processes.json").read_text())[role]
    os.kill(process["pid"], signal.SIGKILL)


@pytest.mark.slow
def test_run_survives_killed_processes_and_resumes_from_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 160 steps (a step takes a fraction of a second here; a replacement generator needs seconds
    # to start, and the run must outlast it: in a full `make test` one joined 77 steps after the
    # loss), evaluated every 20. 24 train prompts and no curriculum: 53 epochs of them, whole.
    data = {"train": small_train_set(tmp_path), "logConsumed": True}
    changes = {
        "evaluation": {"everySteps": 20},
        "data": data,
        "recipe": {"noPositiveResampling": {"enabled": False}},
        "budget": {"maxSteps": 160},
    }
    with running(write_spec(tmp_path, **changes), out) as proc:
        wait_for_step(out, 5, proc, timeout_s=300)
        processes = json.loads((out / "processes.json").read_text())
        trainer = processes["trainer-0"]
        assert "scalerl_policy_version" in scrape(trainer["metrics"])
        # Nothing the run listens on is reachable from the network: loopback only.
        ports = run_ports(processes)
        assert {port: listening_hosts(port) for port in ports} == {
            port: {"127.0.0.1"} for port in ports
        }
        kill(out, "trainer-0")  # kill -9 mid-run: the gang restarts from the step-4 checkpoint
        # A generator dies: it is replaced alone, and the other trains on (and evaluates the
        # lost one's share of the held-out prompts) while the replacement starts.
        resumed = wait_for_resume(out, proc, timeout_s=300)
        wait_for_step(out, resumed + 3, proc, timeout_s=300)
        kill(out, "generator-1")
        output = finish(proc, timeout_s=400)
    assert "restarting from the last checkpoint (1/3): trainer-0 exited with code -9" in output
    assert "generator-1 exited with code -9; starting a replacement" in output
    assert "(2/3)" not in output  # no second gang restart
    trainer_log = (out / "logs" / "trainer-0.log").read_text()
    lost = re.findall(r"generator 1 lost at step (\d+)", trainer_log)
    joined = re.findall(r"generator 1 joins the weight-sync group at step (\d+)", trainer_log)
    assert len(lost) == len(joined) == 1, trainer_log
    assert int(joined[0]) > int(lost[0])  # steps went on while the replacement started
    assert "prediction: A " in output  # A = x [lo, hi], or A >= x where bounded below only

    history = read_history(out / "history.jsonl")
    assert [e["step"] for e in history] == list(range(0, 161, 20))  # nothing twice, no gap
    assert all(0.0 <= e["pass_rate"] <= 1.0 for e in history)
    computes = [e["compute"] for e in history]
    assert computes[0] == 0.0 and computes == sorted(computes)  # training compute only
    # Train-inference mismatch apart from lag (PipelineRL-8). A token's lag counts the oldest
    # version that computed it: a token sampled after an in-flight update reads the keys and
    # values the old weights made, so its lag is never below its own version's (the policy lag)
    # and lag 0 holds only tokens the trainer's weights made whole. On those the float32 engines
    # agree to float error (with the stale cache counted as lag 0, one run read 2e-6).
    for row in (r for r in history[1:] if r["train_mismatch_by_lag"]):  # a step that updated
        by_lag = {int(lag): f for lag, f in row["train_mismatch_by_lag"].items()}
        tokens = sum(f["tokens"] for f in by_lag.values())
        mean_lag = sum(lag * f["tokens"] for lag, f in by_lag.items()) / tokens
        assert mean_lag >= row["train_policy_lag"] - 1e-9
        assert by_lag.get(0, {"kl": 0.0})["kl"] < 1e-9
    # (Whether a sample spans a weight update here depends on timing: the demo's generators
    # finish their batch ahead of the trainer and wait for it. Samples that do, stamped token by
    # token with the version that sampled them: tests/generator/test_engine.py.)
    # The step profile (bench/step_profile.py): the phases, summed over the two attempts up to
    # their checkpoints, add up to the trainer's wall time, as compute does to its training time.
    last, seconds = history[-1], history[-1]["trainer_seconds"]
    phases = [seconds[p] for p in (*PHASES, "other")]
    assert min(phases) >= 0 and seconds["forward_backward"] > 0
    assert math.isclose(sum(phases), seconds["wall"], rel_tol=1e-6)
    training = seconds["wall"] - seconds["start"] - seconds["evaluate"]
    assert last["compute"] * 3600 / 3 == pytest.approx(training, rel=0.05)  # 3 processes
    generation = last["generation"]
    assert 0 < generation["generator_score_seconds"] < generation["generation_seconds"]
    assert trainer_log.count("resumed from") == 1
    assert history[-1]["counters"]["generator_replacements"] == 1
    fit = json.loads((out / "fit.json").read_text())
    assert {"A", "B", "C_mid", "R0", "A_interval"} <= fit.keys()
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not alive(json.loads((out / "processes.json").read_text()))

    # Scaled on resume, 2 -> 3 -> 1 generators, three steps each (shards of 8 prompts, then one
    # of all 24): no prompt was taken twice in an epoch, none was skipped, through the kills,
    # the replacement and the reshards.
    for replicas, steps in ((3, 163), (1, 166)):
        more = {**changes, "generators": {"replicas": replicas}, "budget": {"maxSteps": steps}}
        result = subprocess.run(run_command(write_spec(tmp_path, **more), out),
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        processes = json.loads((out / "processes.json").read_text())
        assert sorted(r for r in processes if r.startswith("generator-")) == [
            f"generator-{g}" for g in range(replicas)
        ]
    epochs = assert_once_per_epoch(out)
    assert len(epochs) == 24
    counts = [len(seen) for seen in epochs.values()]
    assert max(counts) - min(counts) <= 1, epochs  # 166 steps x 8 groups: 55 to 56 epochs each


@pytest.mark.slow
def test_a_generator_that_stops_answering_is_replaced_alone(tmp_path: Path) -> None:
    """SIGSTOP: generator 1's process stays, connected, and answers nothing. The trainer gives
    it up (its next weight broadcast times out and the group re-formed without it: it does not
    join; or, between broadcasts, it sends no rollouts for the peer timeout while generator 0
    does), generator 0 trains on, the runner kills the process the trainer gave up (not a later
    one) and starts a replacement, which joins: no gang restart."""
    out = tmp_path / "run"
    changes = {
        "budget": {"maxSteps": 150},  # outlasts the peer timeout and the replacement's start
        "evaluation": {"everySteps": 50},
        "checkpoint": {"everySteps": 50},
        "failurePolicy": {"peerTimeoutSeconds": 10},
    }
    with running(write_spec(tmp_path, **changes), out) as proc:
        wait_for_step(out, 3, proc, timeout_s=300)
        frozen = json.loads((out / "processes.json").read_text())["generator-1"]["pid"]
        os.kill(frozen, signal.SIGSTOP)
        output = finish(proc, timeout_s=400)
    why = r"(no rollouts for \d+ s \(the peer timeout\)|sync group .* timed out after)"
    assert re.search(rf"generator-1 stopped answering \({why}", output), output
    assert "generator-1 exited with code -9; starting a replacement" in output
    assert "restarting from the last checkpoint" not in output
    trainer_log = (out / "logs" / "trainer-0.log").read_text()
    lost = re.findall(rf"generator 1 lost at step (\d+) \({why}", trainer_log)
    joined = re.findall(r"generator 1 joins the weight-sync group at step (\d+)", trainer_log)
    assert len(lost) == len(joined) == 1, trainer_log
    lost_at, joined_at = int(lost[0][0]), int(joined[0])
    assert joined_at > lost_at  # steps went on meanwhile
    counters = read_history(out / "history.jsonl")[-1]["counters"]
    assert counters["generator_replacements"] == 1
    assert counters["degraded_steps"] >= joined_at - lost_at
    with pytest.raises(ProcessLookupError):
        os.kill(frozen, 0)


def alive(processes: dict[str, dict[str, object]]) -> list[str]:
    """Roles whose process still exists after the run (none may be left behind)."""
    left = []
    for role, process in processes.items():
        if role == "runner":
            continue
        try:
            os.kill(int(process["pid"]), 0)
            left.append(role)
        except ProcessLookupError:
            pass
    return left


def test_missing_model_path_is_reported_before_anything_starts(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, model={"path": str(tmp_path / "no-model")})
    result = subprocess.run(run_command(spec, tmp_path / "o"), capture_output=True, text=True)
    assert result.returncode == 2
    assert f"spec.model.path: {tmp_path / 'no-model'} does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_two_trainer_ranks_learn_survive_a_dead_rank_and_resume_on_one(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ranks = {
        "trainers": {"replicas": 2},
        "generators": {"replicas": 1},
        # The demo's own batch: the small one of the other tests learns too noisily to assert on.
        "recipe": {"batch": {"prompts": 16, "generationsPerPrompt": 8}},
        "data": {"validation": {"prompts": 64}},
        "evaluation": {"everySteps": 10, "generationsPerPrompt": 4},
        "budget": {"maxSteps": 30},
        "checkpoint": {"everySteps": 10},
    }
    with running(write_spec(tmp_path, **ranks), out) as proc:
        wait_for_step(out, 12, proc, timeout_s=400)
        assert set(json.loads((out / "processes.json").read_text())) == {
            "trainer-0", "trainer-1", "generator-0", "runner"
        }  # fmt: skip
        kill(out, "trainer-1")  # a follower dies: the gang restarts from the step-10 checkpoint
        output = finish(proc, timeout_s=600)
    assert "(1/3): trainer-1 exited with code -9" in output
    history = read_history(out / "history.jsonl")
    assert [e["step"] for e in history] == [0, 10, 20, 30]
    # The sharded policy learns: 256 held-out samples per evaluation (standard error about
    # 0.03); `make demo` (one rank, this batch) goes from about 0.16 to 0.4 in 30 steps.
    assert history[-1]["pass_rate"] >= history[0]["pass_rate"] + 0.1, history

    # The 2-rank checkpoint resumes on one trainer rank.
    alone = write_spec(
        tmp_path, **{**ranks, "trainers": {"replicas": 1}, "budget": {"maxSteps": 32}}
    )
    result = subprocess.run(run_command(alone, out), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    log = (out / "logs" / "trainer-0.log").read_text()
    assert "resumed from" in log and "step-000030" in log
    assert [e["step"] for e in read_history(out / "history.jsonl")][-1] == 32


# --- placement: colocated (one process: the trainer and its vLLM engine) ------------------------

COLOCATED = {"placement": "colocated", "generators": {"replicas": 1}, "trainers": {"replicas": 1}}


@pytest.mark.slow
def test_the_demo_learns_colocated_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    demo = {
        **COLOCATED,
        # The demo's own recipe and batch (16 x 8), 40 of its 100 steps.
        "recipe": {"batch": {"prompts": 16, "generationsPerPrompt": 8}},
        "data": {"validation": {"prompts": 128}},
        # Steps 0, 14, 28, 40: the fewest evaluations a spec allows (a fit needs 4).
        "evaluation": {"everySteps": 14, "generationsPerPrompt": 8},
        "budget": {"maxSteps": 40},
        "checkpoint": {"everySteps": 20},
    }
    with running(write_spec(tmp_path, **demo), out) as proc:
        wait_for_step(out, 5, proc, timeout_s=300)
        processes = json.loads((out / "processes.json").read_text())
        assert set(processes) == {"trainer-0", "runner"}  # one process, no generator
        assert _command_line(processes["trainer-0"]["pid"])[-2:] == ["scalerl.cli", "colocated"]
        # One /metrics serves the trainer's series and the engine's.
        served = scrape(processes["trainer-0"]["metrics"])
        for name in ("scalerl_step", "scalerl_generated_sequences_total"):
            assert f'{name}{{namespace="local",run="demo"}}' in served, name
        count = 'scalerl_weight_sync_seconds_count{namespace="local",run="demo"}'
        assert _sample(served, count) >= 4
        finish(proc, timeout_s=400)
    history = read_history(out / "history.jsonl")
    assert [e["step"] for e in history] == [0, 14, 28, 40]
    # 1024 held-out samples per evaluation (standard error about 0.015). Colocated demo runs
    # gained 0.18-0.31 by step 30 and 0.37 by step 40; the spread between runs (about 0.05)
    # comes from training, not from the evaluation.
    assert history[-1]["pass_rate"] >= history[0]["pass_rate"] + 0.15, history
    last = history[-1]
    # PipelineRL in one process: the engine samples the next batch while the trainer steps, so
    # batches come from the previous version (sequences in flight at a weight load continue on
    # the new weights: tests/generator/test_inproc.py).
    assert 0 < last["train_policy_lag"] <= 8
    seconds = last["trainer_seconds"]
    assert seconds["forward_backward"] > 0 and seconds["broadcast"] > 0
    # The compute clock counts one process while it trains: not start-up, not evaluations.
    training = seconds["wall"] - seconds["start"] - seconds["evaluate"]
    assert history[0]["compute"] == 0.0
    assert last["compute"] * 3600 == pytest.approx(training, rel=0.05)
    assert not alive(json.loads((out / "processes.json").read_text()))


# Colocated PPO-off-policy killed and resumed (chat-arith's model; every batch once, no sample
# mixing versions) is the run of tests/tracking/test_tracking_local_run.py, which reads its
# trackers too: one run for both.


@pytest.mark.slow
def test_a_lora_run_learns_survives_a_kill_and_resumes_its_adapter(tmp_path: Path) -> None:
    out = tmp_path / "run"
    lora = {
        # examples/lora.yaml at the demo's batch (16 x 8) for 20 of its 100 steps.
        "recipe": {"batch": {"prompts": 16, "generationsPerPrompt": 8}},
        "data": {"validation": {"prompts": 64}},
        # Steps 0, 7, 14, 20: the fewest evaluations a spec allows (a fit needs 4).
        "evaluation": {"everySteps": 7, "generationsPerPrompt": 8},
        "budget": {"maxSteps": 20},
        "checkpoint": {"everySteps": 10},
    }
    with running(write_spec(tmp_path, "lora.yaml", **lora), out) as proc:
        wait_for_step(out, 12, proc, timeout_s=300)
        served = scrape(json.loads((out / "processes.json").read_text())["trainer-0"]["metrics"])
        sent = _sample(served, 'scalerl_weight_sync_bytes{namespace="local",run="demo-lora"}')
        kill(out, "trainer-0")  # restart from the step-10 checkpoint: its adapter, its optimizer
        output = finish(proc, timeout_s=400)
    assert "restarting from the last checkpoint (1/3)" in output
    assert (out / "logs" / "trainer-0.log").read_text().count("resumed from") == 1
    # Each version moved the adapter alone: rank 16 on the 7 projections of 2 layers, float32.
    checkpoint = out / "checkpoints" / "step-000020"
    adapter = checkpoint / "adapter_model.safetensors"
    assert not (checkpoint / "model.safetensors").exists()
    with safe_open(str(adapter), "pt") as handle:
        assert sent == sum(handle.get_tensor(k).numel() * 4 for k in handle.keys())  # noqa: SIM118
    base = Path(load_run(out / "run.yaml").spec.model.path) / "model.safetensors"
    assert sent < base.stat().st_size / 4
    history = read_history(out / "history.jsonl")
    assert [e["step"] for e in history] == [0, 7, 14, 20]
    # LoRA at lr 1e-3 on the demo read 0.20 -> 0.57-0.58 at step 20 in the README's runs (both
    # placements); full fine-tuning at its lr 1e-4, 0.36-0.43. The bar, 512 samples an
    # evaluation (standard error about 0.02): +0.2.
    assert history[-1]["pass_rate"] >= history[0]["pass_rate"] + 0.2, history
    assert main(["export", str(checkpoint), str(tmp_path / "merged"), "--merge"]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not alive(json.loads((out / "processes.json").read_text()))


def _command_line(pid: object) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def _sample(text: str, series: str) -> float:
    """The value of one series in a /metrics page."""
    line = next(line for line in text.splitlines() if line.startswith(series + " "))
    return float(line.split()[-1])


@pytest.mark.slow
def test_a_lora_run_with_nothing_to_learn_stops_and_says_why(tmp_path: Path) -> None:
    # A user's data whose answers the model never writes (letters outside its alphabet): every
    # group is all wrong, so no step has a signal, and after noSignalSteps the run stops, with
    # the reason, instead of spending its budget. LoRA changes none of this.
    train = tmp_path / "unlearnable.jsonl"
    rows = [{"id": f"t{i}", "prompt": "reverse: abc", "answer": "zzz"} for i in range(64)]
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    unlearnable = {
        "data": {"train": str(train)},
        "failurePolicy": {"noSignalSteps": 3},
        "budget": {"maxSteps": 20},
    }
    spec = write_variant(EXAMPLES / "lora.yaml", tmp_path / "run.yaml", SMALL, unlearnable)
    with running(spec, out) as proc:
        output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, output
    reason = "3 steps in a row with no learning signal; last: no learning signal: 8 of 8 groups"
    assert f"run stopped: {reason} all wrong" in output
    assert "restarting" not in output  # a stop on purpose is not a failure to retry
    stopped = {c["type"]: c for c in json.loads((out / "status.json").read_text())["conditions"]}
    assert stopped["Stopped"]["reason"] == "NoLearningSignal"
    assert json.loads((out / "progress.json").read_text())["step"] == 0  # nothing was trained


# --- budget.stopWhen, locally (fast: a recorded history, no processes) -------------------------


def law_history(out: Path, every: int, seed: int = 2) -> None:
    """history.jsonl of a demo-shaped run heading for A = 0.5: 128 prompts x 8 samples an
    evaluation, every `every` of 100 steps, compute linear to 0.071."""
    from scalerl.fit import sigmoid
    from scalerl.status.history import HeldOut, HistoryRow, PromptScore, TrainSummary

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(0, 101, every):
        compute = 0.071 * step / 100
        rate = float(sigmoid(compute, 0.5, 1.7, 0.02, 0.1))
        scores = [PromptScore(f"val/{i}", 8, int(c), 0) for i, c in
                  enumerate(rng.binomial(8, rate, size=128))]  # fmt: skip
        row = HistoryRow.of(
            step=step, version=step, compute=compute, time=1.7e9 + 4.0 * step,
            held_out=HeldOut.of(scores), train=TrainSummary(), counters={}, trainer_seconds={},
            generation={},
        )  # fmt: skip
        lines.append(json.dumps(row.to_dict()) + "\n")
    (out / "history.jsonl").write_text("".join(lines))


def hopeless_run(tmp_path: Path) -> LocalRun:
    stop = {"budget": {"maxSteps": 100, "stopWhen": {"predictedABelow": 0.7}}}
    spec = write_variant(EXAMPLES / "local.yaml", tmp_path / "run.yaml", stop)
    return LocalRun(load_run(spec), tmp_path / "run", display=False)


def test_a_checked_fit_below_stop_when_stops_the_run_as_the_operator_would(
    tmp_path: Path,
) -> None:
    local = hopeless_run(tmp_path)
    law_history(local.out, every=5)  # 21 evaluations: the half-run check runs
    with pytest.raises(PredictedStop) as stop:
        local.refresh()
    fit = json.loads((local.out / "fit.json").read_text())
    assert fit["confidence"] == "OK" and fit["A_interval"][1] < 0.7
    # The rule reads the forecast at the budget and its interval (F1), as the operator does.
    lo, hi = fit["predictedAtBudgetInterval"]
    assert hi < 0.7
    assert stop.value.reason == (
        f"the forecast at the budget, {fit['predictedAtBudget']:.3f} [{lo:.3f}, {hi:.3f}] from "
        f"{fit['points']} points (confidence OK), lies below stopWhen.predictedABelow 0.7"
    )

    # The run ends there: the condition the operator sets, and no restart.
    def condemned() -> bool:
        raise stop.value

    local.attempt = condemned  # type: ignore[method-assign]
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(PredictedStop):
            local.execute()
    finally:
        signal.signal(signal.SIGTERM, handler)
    conditions = json.loads((local.out / "status.json").read_text())["conditions"]
    stopped = next(c for c in conditions if c["type"] == "Stopped")
    assert (stopped["status"], stopped["reason"]) == ("True", "PredictedBelowTarget")
    assert stopped["message"] == stop.value.reason


def test_an_unchecked_fit_never_stops_a_run(tmp_path: Path) -> None:
    local = hopeless_run(tmp_path)
    law_history(local.out, every=10)  # 11 evaluations: 5 in the first half, no check
    local.refresh()
    fit = json.loads((local.out / "fit.json").read_text())
    assert fit["confidence"] == "Unchecked" and fit["A_interval"][1] < 0.7


def test_a_run_without_a_fit_ends_saying_the_fitter_s_reason(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # The audit's F16: the line blamed "too few evaluations" whatever kept the fit from being made.
    local = hopeless_run(tmp_path)
    law_history(local.out, every=50)  # 3 evaluations: 2 trained points
    assert local.refit(read_history(local.out / "history.jsonl")) is None
    assert local.fit_skipped is not None and "points" in local.fit_skipped
    end = RunEnd(None, local.fit_skipped)
    monkeypatch.setattr("scalerl.local.run_local", lambda *a, **k: end)
    assert main(["run", str(tmp_path / "run.yaml")]) == 0
    assert capsys.readouterr().out == f"run finished; no prediction: {local.fit_skipped}\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_run_at_its_step(tmp_path: Path, signum: int) -> None:
    local = hopeless_run(tmp_path)
    local.out.mkdir(parents=True)
    (local.out / "progress.json").write_text(json.dumps({"step": 37}))

    def interrupted() -> bool:
        os.kill(os.getpid(), signum)  # SIGTERM reaches execute's handler; SIGINT pytest's
        time.sleep(5)
        raise AssertionError("no signal arrived")

    local.attempt = interrupted  # type: ignore[method-assign]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a library may leave it: Ctrl-C still stops
    try:
        with pytest.raises(Interrupted) as stop:
            local.execute()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert str(stop.value) == "stopped at step 37; run the same command again to resume"
    assert stop.value.signum == signum
