"""The held-out curve is the held-out truth: a demo run's history, its per-prompt records, its
Prometheus gauges, its fit and an independent evaluation of its checkpoints (Hugging Face
`generate`, no vLLM) all say the same numbers.

The definitions checked are the README's ("What a run leaves") and DESIGN's metric table:
`pass_rate` is the held-out mean@k of one evaluation, correct samples / samples over the
validation prompts, with its standard error from the per-prompt means; a sample is correct when
its reward is positive and it was not truncated; compute is training compute (0 at step 0).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from test_local import finish, running, scrape, write_spec

from scalerl.hfeval import evaluate_checkpoint, iter_checkpoints
from scalerl.spec import load_run
from scalerl.status.history import read_history, read_scores

pytestmark = pytest.mark.slow

STEPS, EVERY, PROMPTS, K = 20, 5, 128, 8
# The demo's own recipe (batch 16 x 8), its 128 held-out prompts x 8 samples (standard error
# about 0.013), 20 of its 100 steps, evaluated every 5 (enough points for a fit), a checkpoint at
# every evaluation.
DEMO = {
    "recipe": {"batch": {"prompts": 16, "generationsPerPrompt": 8}},
    "data": {"validation": {"prompts": PROMPTS}},
    "evaluation": {"everySteps": EVERY, "generationsPerPrompt": K, "logCompletions": 4},
    "budget": {"maxSteps": STEPS},
    "checkpoint": {"everySteps": EVERY, "keep": 5},
    "fit": {"everyEvaluations": 1},
}
RUN = 'namespace="local",run="demo"'


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run's directory, and the trainer's gauges as scraped right after an evaluation."""
    tmp = tmp_path_factory.mktemp("heldout")
    out = tmp / "run"
    with running(write_spec(tmp, **DEMO), out) as proc:
        gauges = gauges_after_evaluation(out, proc, step=EVERY)
        finish(proc, timeout_s=600)
    return {"out": out, "gauges": gauges}


def gauges_after_evaluation(out: Path, proc: Any, step: int) -> dict[str, Any]:
    """The last history row and the trainer's gauges, read when no evaluation came in between."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended before its evaluation at step {step}"
        before = read_history(out / "history.jsonl")
        if before and before[-1]["step"] >= step:
            url = json.loads((out / "processes.json").read_text())["trainer-0"]["metrics"]
            served = scrape(url)
            if read_history(out / "history.jsonl") == before:
                return {"row": before[-1], "metrics": served}
        time.sleep(0.2)
    raise AssertionError(f"no evaluation at step {step} within 300 s")


def gauge(served: str, name: str) -> float:
    prefix = f"scalerl_{name}{{{RUN}}} "
    line = next(x for x in served.splitlines() if x.startswith(prefix))
    return float(line.removeprefix(prefix))


def test_every_evaluation_is_exactly_what_its_prompts_scored(demo: dict[str, Any]) -> None:
    out = demo["out"]
    history = read_history(out / "history.jsonl")
    assert [row["step"] for row in history] == list(range(0, STEPS + 1, EVERY))
    for row in history:
        scores = read_scores(out, row["step"])
        assert len({s.prompt_id for s in scores}) == len(scores) == PROMPTS
        assert all(s.samples == K for s in scores)
        correct = sum(s.correct for s in scores)
        samples = sum(s.samples for s in scores)
        assert (row["eval_correct"], row["eval_samples"]) == (correct, samples) == (correct, 1024)
        assert row["pass_rate"] == correct / samples
        means = [s.correct / s.samples for s in scores]
        se = statistics.stdev(means) / math.sqrt(len(means))
        assert row["pass_rate_se"] == pytest.approx(se, rel=1e-9)
        assert row["eval_truncation_rate"] == sum(s.truncated for s in scores) / samples


def test_the_held_out_pass_rate_agrees_with_an_independent_evaluation(
    demo: dict[str, Any],
) -> None:
    """Each checkpoint (and the base model, for step 0) evaluated with HF `generate` on the same
    prompts: the run's number is within 3 standard errors of the independent one."""
    out = demo["out"]
    run = load_run(out / "run.yaml")  # the spec as the run resolved it
    history = {row["step"]: row for row in read_history(out / "history.jsonl")}
    checkpoints = dict(iter_checkpoints(out))
    for step, model in ((0, run.spec.model.path), (STEPS, checkpoints[STEPS])):
        independent = evaluate_checkpoint(model, run, k=K, seed=1234 + step)
        assert independent.samples == PROMPTS * K
        row = history[step]
        combined = math.hypot(row["pass_rate_se"], independent.stderr)
        assert abs(row["pass_rate"] - independent.pass_rate) <= 3 * combined, (
            step,
            row["pass_rate"],
            independent.pass_rate,
        )


def test_the_gauges_say_what_the_history_says(demo: dict[str, Any]) -> None:
    row, served = demo["gauges"]["row"], demo["gauges"]["metrics"]
    assert gauge(served, "eval_pass_rate") == row["pass_rate"]
    assert gauge(served, "eval_pass_rate_stderr") == row["pass_rate_se"]
    assert gauge(served, "eval_compute_hours") == row["compute"]  # the pair, exported together
    assert gauge(served, "step") >= row["step"]


def test_the_generators_totals_count_each_sample_once(demo: dict[str, Any]) -> None:
    """Every step takes one batch of 16 groups x 8 samples, and the generators run at most two
    batches ahead of the trainer (their quota), so by step N they made between 128 N and
    128 (N + 2) training samples, whatever the checkpoints in between."""
    for row in read_history(demo["out"] / "history.jsonl")[1:]:
        made = row["generation"]["generated_samples"]
        assert 128 * row["step"] <= made <= 128 * (row["step"] + 2), row


def test_completions_are_kept_for_a_person_to_read(demo: dict[str, Any]) -> None:
    path = demo["out"] / "evaluations" / f"step-{STEPS:08d}.completions.jsonl"
    completions = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(completions) == 4
    for c in completions:
        assert c["prompt"] and isinstance(c["completion"], str) and c["answer"]
        assert c["passed"] == (c["reward"] > 0 and not c["truncated"])


def test_compute_starts_at_zero_and_the_prediction_is_at_the_runs_end(
    demo: dict[str, Any],
) -> None:
    out = demo["out"]
    history = read_history(out / "history.jsonl")
    assert history[0]["compute"] == 0.0  # start-up is not training
    fit = json.loads((out / "fit.json").read_text())
    # The run stopped at maxSteps, so that is the budget it hit, at the compute it had then.
    assert fit["budgetLimit"] == "maxSteps"
    assert fit["budget"] == pytest.approx(history[-1]["compute"], rel=1e-9)
