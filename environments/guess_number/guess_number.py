"""guess-number: find a secret number from "higher"/"lower" hints (a verifiers MultiTurnEnv).

Each row holds a secret from 1 to `high` (drawn from `seed`) in `info`. The model guesses; the
environment answers "higher" or "lower" as a user message; the rollout ends on a correct guess or
after `max_turns` guesses. The reward is 1.0 when the secret was found, else 0.0; the number of
guesses is reported as a metric of weight 0.

    import verifiers as vf
    env = vf.load_environment("guess-number", num_train=1000, num_eval=64, high=8, max_turns=4)
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Reply with one number."


def prompt_text(high: int) -> str:
    return f"Guess the number from 1 to {high}."


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def _content(message: Any) -> Any:
    return (
        message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    )


def guess_of(message: Any) -> int | None:
    """The number an assistant message guesses, or None when its text is not a whole number."""
    content = _content(message)
    text = content.strip() if isinstance(content, str) else ""
    return int(text) if text.isascii() and text.isdigit() else None


def guesses(completion: vf.Messages) -> list[int | None]:
    return [guess_of(m) for m in completion if _role(m) == "assistant"]


def found(completion: vf.Messages, info: dict[str, Any]) -> float:
    """1.0 when some guess was the secret (the rollout stops at it, so within the turn limit)."""
    return 1.0 if info["secret"] in guesses(completion) else 0.0


def turns(completion: vf.Messages) -> float:
    """How many guesses the model made."""
    return float(len(guesses(completion)))


class GuessNumberEnv(vf.MultiTurnEnv):
    def __init__(self, high: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.high = high

    @vf.stop
    async def guessed_right(self, state: vf.State) -> bool:
        """Stop as soon as the last guess is the secret: nothing is left to say."""
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return _role(last) == "assistant" and guess_of(last) == state["info"]["secret"]

    async def env_response(
        self, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> vf.Messages:
        guess, secret = guess_of(messages[-1]), state["info"]["secret"]
        if guess is None:
            hint = f"Reply with a number from 1 to {self.high}."
        else:
            hint = "higher" if guess < secret else "lower"
        return [vf.UserMessage(content=hint)]


def make_split(count: int, high: int, rng: random.Random) -> Dataset:
    secrets = [rng.randint(1, high) for _ in range(count)]
    return Dataset.from_dict(
        {
            "question": [prompt_text(high)] * count,
            "answer": [str(s) for s in secrets],
            "info": [{"secret": s} for s in secrets],
        }
    )


def load_environment(
    num_train: int = 1000, num_eval: int = 64, seed: int = 0, max_turns: int = 4, high: int = 8
) -> vf.Environment:
    if high < 2:
        raise ValueError(f"high must be >= 2 (a secret from 1 to high), got {high}")
    if num_train < 1 or num_eval < 1:
        raise ValueError(f"num_train and num_eval must be >= 1, got {num_train} and {num_eval}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    rng = random.Random(seed)
    eval_dataset = make_split(num_eval, high, rng)
    dataset = make_split(num_train, high, rng)
    rubric = vf.Rubric(funcs=[found, turns], weights=[1.0, 0.0])
    return GuessNumberEnv(
        high=high,
        dataset=dataset,
        eval_dataset=eval_dataset,
        system_prompt=SYSTEM_PROMPT,
        rubric=rubric,
        max_turns=max_turns,
    )
