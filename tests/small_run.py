"""A small valid ScaleRLRun as a user writes it (one trainer, two generators, one GPU each), with
any part of its spec replaced:

    run_manifest("research", "r1", placement="colocated", generators={"replicas": 1})
"""

from __future__ import annotations

from typing import Any

from scalerl.runfile import merge


def run_manifest(namespace: str, name: str = "r1", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"path": "/models/base"},
            "data": {"train": "/data/train.jsonl"},
            "fit": {"everyEvaluations": 3, "minCompute": 0},
            "generators": {"replicas": 2, "gpus": 1},
            "trainers": {"replicas": 1, "gpus": 1},
            "checkpoint": {"claimName": "ckpt"},
        },
    }
    merge(body["spec"], spec)
    return body
