"""A code run's held-out evaluation, as the generator makes it: the engine is scripted (it writes
the programs below as tokens), everything after it runs for real: the scorer, the sandbox, the
per-prompt scores, the message to the trainer, the history row and the run's files.

The pass rate is recounted from the scripted completions alone: the right programs over prompts x
k. A program that crashes its sandbox on purpose, and one whose sandbox could not run at all,
count as not passed; neither leaves the denominator (audit F12/F13: they used to be dropped, and
0.25 read 0.40).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scalerl.demo.tokenizer import build_tokenizer
from scalerl.environment import ProcessEnv
from scalerl.generator.main import Generator
from scalerl.generator.prompts import Example, PromptEncoder
from scalerl.generator.scoring import Scorer
from scalerl.generator.tokens import ModelTokens
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout.records import EvalResult, Evaluate, Sample
from scalerl.sandbox import isolation
from scalerl.spec import CodeSpec, parse_run
from scalerl.status.files import FileStatus
from scalerl.status.history import SANDBOX, HeldOut, HistoryRow, read_history, read_scores

# One line each: the demo tokenizer has no newline.
RIGHT = "print(sum(map(int, input().split())))"
WRONG = "print(0)"
RAISES = "raise SystemExit(3)"
# Ends the kept sandbox's first process (audit S14): a wrong program that used to be dropped.
CRASHES = "import os, signal; os.kill(1, signal.SIGINT)"
TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
K = 4
SCRIPT = {
    "add0": [RIGHT, WRONG, CRASHES, RIGHT],
    "add1": [CRASHES, CRASHES, CRASHES, RIGHT],
    "add2": [WRONG, RAISES, RIGHT, CRASHES],
}


@dataclass
class ProgramsEngine:
    """Writes each prompt's scripted programs, in order, as tokens ending in EOS."""

    tokenizer: Any
    programs: dict[str, list[str]]
    version: int = 0
    prompts: list[str] = field(default_factory=list)

    async def generate(self, prompt_ids: list[int], n: int, seed: str | None = None) -> list[Any]:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        self.prompts.append(prompt)
        texts = self.programs[prompt]
        assert len(texts) == n
        eos = self.tokenizer.eos_token_id
        return [
            self._sample([*self.tokenizer.encode(t, add_special_tokens=False), eos]) for t in texts
        ]

    def _sample(self, ids: list[int]) -> Sample:
        n = len(ids)
        return Sample(ids, [-0.5] * n, [0] * n, [1] * n, 0.0, False, False, "stop")


@dataclass
class Inbox:
    """The generator's end of the channel: what it sends to the trainer."""

    sent: list[Any] = field(default_factory=list)

    def try_send(self, message: Any) -> bool:
        self.sent.append(message)
        return True


def code_generator(
    tmp_path: Path,
    scorer: Scorer,
    metrics: GeneratorMetrics,
    script: dict[str, list[str]] = SCRIPT,
    validation: list[Example] | None = None,
) -> Generator:
    run = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "code"},
            "spec": {
                "model": {"path": "/nowhere", "thinkEnd": None},
                "data": {"train": str(tmp_path / "train.jsonl"), "reward": "code"},
                "recipe": {"length": {"interruption": {"enabled": False}}},
                "evaluation": {"everySteps": 1, "generationsPerPrompt": K, "logCompletions": 3},
                "budget": {"maxSteps": 100},
            },
        }
    )
    tokenizer = build_tokenizer()
    env = ProcessEnv(
        spec=tmp_path / "run.yaml",
        run_dir=tmp_path,
        trainer_host="127.0.0.1",
        channel_port=1,
        sync_port=1,
        metrics_port=0,
        compute_units=1,
        generator_index=0,
    )
    return Generator(
        run=run,
        env=env,
        engine=ProgramsEngine(tokenizer, script),  # type: ignore[arg-type]
        channel=Inbox(),  # type: ignore[arg-type]
        scorer=scorer,
        tokens=ModelTokens(tokenizer, frozenset({tokenizer.eos_token_id}), None),
        prompts=PromptEncoder(tokenizer, 64),
        train=[],
        validation=validation or [Example(p, p, TESTS, domain="code") for p in script],
        metrics=metrics,
    )


def evaluated(generator: Generator, tmp_path: Path) -> tuple[EvalResult, dict[str, Any]]:
    """The generator's evaluation at step 0, and its history row as the run's files hold it."""
    asyncio.run(generator.evaluate(Evaluate(step=0, version=0)))
    result = next(m for m in generator.channel.sent if isinstance(m, EvalResult))  # type: ignore[union-attr]
    row = HistoryRow.of(
        step=0,
        version=0,
        compute=0.0,
        time=0.0,
        held_out=HeldOut.of(result.scores),
        train=None,
        counters={},
        trainer_seconds={},
        generation={},
    )
    FileStatus(tmp_path).evaluation(row, result.scores, result.completions)
    [written] = read_history(tmp_path / "history.jsonl")
    return result, written


def needs_bubblewrap() -> None:
    # In plain mode PID 1 is the machine's own: the crashing program must not run there.
    if isolation.probe().mode != "bwrap":
        pytest.skip("the crashing program needs bubblewrap's PID namespace")


def test_a_code_runs_pass_rate_is_the_right_programs_over_prompts_times_k(tmp_path: Path) -> None:
    needs_bubblewrap()
    metrics = GeneratorMetrics("ns", "code")
    scorer = Scorer("code", CodeSpec(workers=2, test_timeout_seconds=2), metrics)
    try:
        result, row = evaluated(code_generator(tmp_path, scorer, metrics), tmp_path)
    finally:
        scorer.close()
    # Independently, from the completions the engine wrote: a pass is the right program.
    right = sum(texts.count(RIGHT) for texts in SCRIPT.values())
    asked = len(SCRIPT) * K
    assert (right, asked) == (4, 12)
    assert row["pass_rate"] == right / asked
    assert (row["eval_samples"], row["eval_correct"]) == (asked, right)
    # Every crash is there: failed (its program's fault) or unscored (the sandbox's), not gone.
    scores = read_scores(tmp_path, 0)
    assert [s.samples for s in scores] == [K] * len(SCRIPT)
    crashes = sum(texts.count(CRASHES) for texts in SCRIPT.values())
    assert row["eval_unscored"] <= crashes
    assert row["eval_unscored_reasons"] in ({}, {SANDBOX: row["eval_unscored"]})
    for score in scores:
        assert score.correct == SCRIPT[score.prompt_id].count(RIGHT)
    # The next prompt's right program still passed after the crashes before it.
    assert [s.correct for s in result.scores] == [2, 1, 1]


def test_samples_whose_sandbox_cannot_run_are_unscored_failures_and_leave_the_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox that cannot start (bubblewrap refuses its arguments: no program's doing) scores
    no program: the code prompts' samples are unscored, counted as not passed, beside a prompt
    of another domain scored by `exact`; the evaluation is marked to be left out of the fit."""
    needs_bubblewrap()
    script = {"add0": SCRIPT["add0"], "add1": SCRIPT["add1"], "echo": ["x", "x", "y", "x"]}
    validation = [
        Example("add0", "add0", TESTS, reward="code", domain="code"),
        Example("add1", "add1", TESTS, reward="code", domain="code"),
        Example("echo", "echo", "x", reward="exact", domain="echo"),
    ]
    metrics = GeneratorMetrics("ns", "code")
    scorer = Scorer(["code", "exact"], CodeSpec(workers=2), metrics)
    monkeypatch.setattr(
        isolation, "bwrap_argv", lambda python, fresh=True, proc=True: ["bwrap", "--bad-flag"]
    )
    try:
        generator = code_generator(tmp_path, scorer, metrics, script, validation)
        result, row = evaluated(generator, tmp_path)
    finally:
        scorer.close()
    # Independently: only the echo prompt's "x" answers can pass; 8 programs were never run.
    passes, asked = script["echo"].count("x"), len(script) * K
    assert (passes, asked) == (3, 12)
    assert (row["pass_rate"], row["eval_samples"]) == (passes / asked, asked)  # not 3 / 4
    assert (row["eval_unscored"], row["eval_unscored_reasons"]) == (8, {SANDBOX: 8})
    assert row["fit_excluded"].startswith("8 of 12 samples could not be scored (sandbox 8)")
    assert [s.unscored for s in result.scores] == [K, K, 0]
    assert row["pass_rate_by_domain"]["code"]["pass_rate"] == 0.0
    assert row["pass_rate_by_domain"]["echo"]["pass_rate"] == 3 / 4


def test_the_share_asked_is_of_the_trainers_division_not_of_the_spec_the_generator_read(
    tmp_path: Path,
) -> None:
    """A pool scaled while it runs (`kubectl scale srl`): the trainer divides the held-out
    prompts by the size it follows now, which a generator started earlier never read. Share 2 of
    3 is every third prompt from the third, though this generator's spec says 8 generators."""
    metrics = GeneratorMetrics("ns", "code")
    generator = code_generator(tmp_path, Scorer("exact", CodeSpec(), metrics), metrics)
    assert generator.spec.generators.replicas == 8
    generator.held_out = [Example(f"p{i}", f"prompt {i}", "1") for i in range(7)]
    shares = {s: generator.shard_of(Evaluate(3, 1, shard=s, shards=3)) for s in range(3)}
    assert {s: (index, [e.id for e in share]) for s, (index, share) in shares.items()} == {
        0: (0, ["p0", "p3", "p6"]),
        1: (1, ["p1", "p4"]),
        2: (2, ["p2", "p5"]),
    }
    # Without a division (a message of an older trainer) the spec's count divides.
    assert [e.id for e in generator.shard_of(Evaluate(3, 1, shard=1))[1]] == ["p1"]
