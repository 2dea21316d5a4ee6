"""What every system of bench/trl_bench.py shares: the evaluator's seed, when a target counts as
reached, one evaluation as recorded, the load sampler, a system's result, and the spec copy every
system trains from."""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from scalerl.runfile import write_variant
from scalerl.spec import RunSpec, parse_run

STOP_GRACE_S = 60.0
MAX_CHECKPOINTS_KEPT = 1000  # spec.checkpoint.keep's upper bound
LORA_DEFAULT = {"rank": 16, "alpha": 32}
# An adapter moves less per step than the whole model: LoRA runs usually take about 10x the
# learning rate (examples/lora.yaml: 1e-3 for the demo's 1e-4).
LORA_LR_FACTOR = 10.0


def eval_seed(spec: RunSpec, step: int) -> int:
    """The evaluator's seed at `step`: the same for every system."""
    return spec.seed + 1000 + step


def reached(series: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation at or above `target` whose next one is at or above it too."""
    for first, repeat in pairwise(series):
        if first["pass_rate"] >= target - 1e-9 and repeat["pass_rate"] >= target - 1e-9:
            return first
    return None


def point(evaluation: Any, step: int) -> dict[str, Any]:
    """One evaluation of `scalerl.hfeval` as the bench records it."""
    return {
        "step": step,
        "pass_rate": evaluation.pass_rate,
        "stderr": evaluation.stderr,
        "correct": evaluation.correct,
        "samples": evaluation.samples,
        "truncated": evaluation.truncated,
        "eval_s": evaluation.seconds,
    }


class LoadSampler:
    """Samples the 1-minute load average every few seconds while a system runs."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"mean": statistics.fmean(self.samples), "max": max(self.samples)}


@dataclass
class Result:
    """One system's figures; seconds are None when the target was not reached."""

    system: str
    evaluator: str = ""
    evals: list[dict[str, Any]] = field(default_factory=list)  # step, pass_rate, clocks...
    target: float | None = None
    hit: dict[str, Any] | None = None  # where the last target was reached (confirmed)
    steps: int = 0
    samples: int = 0
    load: dict[str, float] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> float | None:
        return self.evals[0]["pass_rate"] if self.evals else None

    @property
    def final(self) -> float | None:
        return self.evals[-1]["pass_rate"] if self.evals else None

    def first(self, gain: float) -> dict[str, Any] | None:
        """Where this system reached its start + `gain` (see `reached`)."""
        start = self.start
        return None if start is None else reached(self.evals, start + gain)


def bench_spec(
    spec_path: Path,
    eval_every: int | None,
    out_dir: Path,
    placement: str = "disaggregated",
    lora: bool = False,
) -> Path:
    """A copy of the spec: `evaluation.everySteps` (when asked), a checkpoint at every
    evaluation, all kept, and the placement (colocated is one process, so one trainer and one
    engine); the recipe is the same. `lora`: LoRA_DEFAULT and its learning rate where the spec
    has no `model.lora`."""
    data = yaml.safe_load(spec_path.read_text())
    spec = data.setdefault("spec", {})
    spec["placement"] = placement
    if placement == "colocated":
        for role in ("generators", "trainers"):
            spec.setdefault(role, {})["replicas"] = 1
    if lora and not spec.setdefault("model", {}).get("lora"):
        spec["model"]["lora"] = dict(LORA_DEFAULT)
        optimizer = spec.setdefault("recipe", {}).setdefault("optimizer", {})
        optimizer["lr"] = parse_run(data).spec.recipe.optimizer.lr * LORA_LR_FACTOR
    evaluation = spec.setdefault("evaluation", {})
    if eval_every is not None:
        evaluation["everySteps"] = eval_every
    parsed = parse_run(data).spec
    every = parsed.evaluation.every_steps
    checkpoint = spec.setdefault("checkpoint", {})
    checkpoint["everySteps"] = every
    checkpoint["keep"] = min(MAX_CHECKPOINTS_KEPT, parsed.budget.max_steps // every + 2)
    # The copy lives elsewhere: make relative paths absolute, as `scalerl run` reads them (from
    # the working directory).
    places = [(spec.get("model", {}), "path"), (spec.get("data", {}), "train")]
    places.append((spec.get("data", {}).get("validation") or {}, "path"))
    for section, key in places:
        value = section.get(key)
        if isinstance(value, str) and not value.startswith("builtin:"):
            section[key] = str(Path(value).expanduser().resolve())
    return write_variant(data, out_dir / f"bench-{placement}.yaml")
