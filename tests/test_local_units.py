"""What a local run counts as compute (scalerl/local.py), without starting its processes: GPUs
where the spec has them, processes on CPU, as on a cluster (`RunSpec.cluster_compute_units`).

(The end-to-end runs are tests/test_local.py, marked slow.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scalerl import local
from scalerl.environment import ProcessEnv
from scalerl.spec import load_run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def launched_envs(example: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> list[ProcessEnv]:
    """The environments LocalRun.launch gives its processes (none is started)."""
    envs: list[ProcessEnv] = []
    monkeypatch.setattr(local.Gang, "start", lambda self, role, command, env, log: envs.append(env))
    local.LocalRun(load_run(EXAMPLES / example), out, display=False).launch()
    return envs


@pytest.mark.parametrize(
    ("example", "units", "unit"),
    [
        ("run.yaml", 8 * 8 + 2 * 8, "GPU-hours"),  # 8 generators and 2 trainers of 8 GPUs
        ("local.yaml", 3, "process-hours"),  # 2 generators and a trainer on CPU
        ("colocated.yaml", 1, "process-hours"),  # one process holds both
    ],
)
def test_every_process_counts_the_runs_gpus_or_its_processes(
    example: str, units: int, unit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = launched_envs(example, tmp_path, monkeypatch)
    assert envs and {env.compute_units for env in envs} == {units}
    assert load_run(EXAMPLES / example).spec.compute_unit == unit


def test_the_fit_counts_the_same_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # etaSeconds divides compute by the units: the fit must count what the trainer counted.
    seen: dict[str, Any] = {}

    def write_fit(history: list[dict[str, Any]], out: Path, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"A": 0.8, "B": 1.5, "C_mid": 120.0, "R0": 0.1, "points": 9, "confidence": "OK"}

    monkeypatch.setattr("scalerl.fit.report.write_fit", write_fit)
    run = local.LocalRun(load_run(EXAMPLES / "run.yaml"), tmp_path, display=False)
    run.refit([])
    assert seen["units"] == 80


def test_the_runner_serves_the_targets_of_the_spec(tmp_path: Path) -> None:
    run = load_run(EXAMPLES / "run.yaml")  # stopWhen.predictedABelow 0.5, no targetPassRate
    metrics = local.LocalRun(run, tmp_path, display=False).metrics
    labels = {"namespace": run.namespace, "run": run.name}
    assert metrics.registry.get_sample_value("scalerl_stop_asymptote_below", labels) == 0.5
    assert metrics.registry.get_sample_value("scalerl_target_pass_rate", labels) is None
