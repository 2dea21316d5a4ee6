"""Trainer pods with several GPUs: the operator's container command (torchrun, one rank per GPU)
run as two pods would run it, on CPU. Every rank numbers itself from its pod's index and
torchrun's local rank, and all of them meet in one process group at trainer 0.

`scalerl` on the pods' PATH is a stand-in that does what the trainer does first (read the
environment contract, join the ranks) and then one all-reduce, so the test needs no generators.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from strangers import stranger_calls

from scalerl.operator import manifests
from scalerl.operator.manifests import Images, Owner
from scalerl.ports import free_port
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import parse_run

ROOT = Path(__file__).resolve().parents[2]
PODS, GPUS = 2, 2
TIMEOUT_S = 180

STAND_IN = f"""#!{sys.executable}
import json, os, sys
import torch, torch.distributed as dist
from scalerl.environment import ProcessEnv
from scalerl.trainer.shard import end_rank_process, join_ranks, leave_ranks

assert sys.argv[1:] == ["trainer"], sys.argv
env = ProcessEnv.from_environ()
ranks = join_ranks(env)
total = torch.tensor([float(ranks.rank)])
dist.all_reduce(total)
out = os.path.join(os.environ["OUT"], f"rank-{{ranks.rank}}.json")
with open(out, "w") as f:
    json.dump({{"rank": ranks.rank, "world": ranks.world_size, "local": env.trainer_local_rank,
               "metrics_port": env.metrics_port, "sum": total.item()}}, f)
leave_ranks(finished=True)
end_rank_process(0)
"""


def trainer_container() -> dict:
    raw = yaml.safe_load((ROOT / "examples" / "run.yaml").read_text())
    raw["spec"]["trainers"].update(replicas=PODS, gpus=GPUS)
    run = parse_run(raw)
    job = manifests.workload(run, Owner(run.name, "research", "u"), "trainer", 0, Images())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.slow  # four trainer processes
def test_two_pods_of_two_gpus_are_four_ranks_in_one_group(tmp_path: Path) -> None:
    container = trainer_container()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scalerl").write_text(STAND_IN)
    (bin_dir / "scalerl").chmod(0o755)
    pod_env = {e["name"]: e["value"] for e in container["env"]}
    # What the pod's Service and the kubelet give; here trainer 0 is on loopback.
    # The run's keys, as the Secret's volume holds them (the pods' path replaced by a local one).
    StreamKeys.generate().write(tmp_path / "keys")
    ranks_port = free_port()
    pod_env |= {
        "SCALERL_TRAINER_HOST": "127.0.0.1",
        "SCALERL_BIND_HOST": "127.0.0.1",
        "SCALERL_RANKS_PORT": str(ranks_port),
        "SCALERL_PEER_TIMEOUT": "60",
        "SCALERL_STREAM_KEYS": str(tmp_path / "keys"),
    }
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])

    def start(pod: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            container["command"],
            env={**os.environ, **pod_env, "JOB_COMPLETION_INDEX": str(pod)}
            | {"PATH": path, "OUT": str(tmp_path)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    # Pod 0 serves the ranks' store and waits for pod 1. Meanwhile strangers at the port (torch's
    # client, a client with another run's keys) get no handshake: they cannot take a rank's place.
    pods = [start(0)]
    wait_listening(ranks_port)
    other = StreamKeys.generate()
    strangers = stranger_calls(ranks_port, None) + stranger_calls(ranks_port, other)
    assert [o.split(":")[0] for o in strangers] == ["refused", "no answer", "no answer"]
    pods.append(start(1))
    logs = [pod.communicate(timeout=TIMEOUT_S)[0] for pod in pods]
    assert [pod.returncode for pod in pods] == [0] * PODS, "\n".join(logs)

    seen = sorted(
        (json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")), key=lambda r: r["rank"]
    )
    world = PODS * GPUS
    assert [r["rank"] for r in seen] == list(range(world))
    assert [r["local"] for r in seen] == list(range(GPUS)) * PODS
    assert {r["world"] for r in seen} == {world}
    assert {r["sum"] for r in seen} == {sum(range(world))}  # all four in one group
    metrics = int(pod_env["SCALERL_METRICS_PORT"])
    assert [r["metrics_port"] for r in seen] == [metrics, 0] * PODS  # one per pod


def wait_listening(port: int, timeout_s: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
