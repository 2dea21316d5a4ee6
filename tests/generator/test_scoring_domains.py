"""A run of several domains scores each group by its row's reward: one scorer holds every reward
the rows name (math, exact, code), and a name it was not given is refused, never guessed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from scalerl.errors import InputError
from scalerl.generator.prompts import load_examples
from scalerl.generator.scoring import Scorer, rewards_of
from scalerl.spec import CodeSpec

ADD = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_each_group_is_scored_by_the_reward_its_row_names() -> None:
    scorer = Scorer(["math", "exact", "code"], CodeSpec(workers=1))
    try:
        # "1/2" and "0.5" are one number to math, two strings to exact.
        pairs = [("1/2", "0.5"), ("0.5", "0.5")]
        assert asyncio.run(scorer.score(pairs, "math")) == [1.0, 1.0]
        assert asyncio.run(scorer.score(pairs, "exact")) == [-1.0, 1.0]
        assert asyncio.run(scorer.score(pairs)) == [1.0, 1.0]  # the first named: the run's
        programs = [(RIGHT, ADD), ("print(0)", ADD)]
        assert asyncio.run(scorer.score(programs, "code")) == [1.0, -1.0]
        with pytest.raises(InputError, match="reward 'bogus' was not loaded"):
            asyncio.run(scorer.score(pairs, "bogus"))
    finally:
        scorer.close()


def test_a_math_and_exact_run_needs_no_code_pool() -> None:
    assert Scorer(["math", "exact"]).pool is None


def test_the_generator_loads_every_reward_its_rows_name_the_runs_first(tmp_path: Path) -> None:
    rows = [
        {"prompt": "1+1", "answer": "2"},
        {"prompt": "add", "answer": ADD, "reward": "code"},
        {"prompt": "say a", "answer": "a", "reward": "exact"},
        {"prompt": "add again", "answer": ADD, "reward": "code"},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_examples(path, reward="math")
    assert rewards_of("math", examples) == ["math", "code", "exact"]
