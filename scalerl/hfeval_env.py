"""Held-out pass rate of a run with `spec.environment`, measured with Hugging Face `generate`.

The same question `scalerl.hfeval` answers for one-completion runs, asked of an agent run: each
held-out prompt of the environment (its eval split, or `data.validation.path`) is played `k`
times through verifiers' own rollout loop, the generators' (`scalerl.agents.rollouts.AgentRollouts`
with `scalerl.agents.client.EngineClient`: the environment's turns, tools, turn limit, tool
timeouts and rubric; one thinking cutoff and one answer budget per rollout), and each model turn
is sampled under the generators' length rules (`scalerl.generator.length.LengthControl`, with what
the rollout has left: thinking up to the cutoff, the interruption phrase, the answer budget, the
model's context), whose requests alone are served by HF `generate` in torch instead of vLLM, at
`recipe.sampling.temperature` filtered by its topP, topK and minP in the generators' order
(`scalerl.hfeval_result.sampling_settings`), stopping on every EOS id of the model.
Unlike `scalerl.hfeval`'s single-turn path, the rules are the generators' own code: what is
measured independently here is the sampling, by another engine.

Each turn samples from torch's RNG seeded by a string of the evaluation's seed, the prompt, the
rollout and the turn, so the evaluation is a function of the seed and the weights alone (the
order in which the rollouts of a group take their turns does not matter); the caller's RNG state
and the model's train/eval mode are left as they were.

A rollout passes by `Sample.passed` (reward >= `environment.passThreshold`, not truncated, its
reward computed), as the generators decide. The pass rate is passes / (prompts x k): a rollout
the environment fails (it raised, timed out) and one whose rubric raised could not be scored;
each counts as not passed and is reported (`Evaluation.unscored`, by reason), as the generators'
evaluations do.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from scalerl.agents.client import EngineClient, SampleTurn
from scalerl.agents.load import environment_examples, load_environment
from scalerl.agents.rollouts import AgentRollouts, Played
from scalerl.errors import DataError, InputError
from scalerl.generator.length import Allowance, LengthControl, Sampler, Segment
from scalerl.generator.prompts import Example
from scalerl.generator.tally import Group, score
from scalerl.generator.tokens import ModelTokens
from scalerl.hfeval_result import (
    Evaluation,
    domain_rates,
    plain_generation_config,
    sampling_settings,
)
from scalerl.preflight import model_limit
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters
from scalerl.rollout.records import Sample
from scalerl.spec import EnvironmentSpec, ScaleRLRun
from scalerl.status.history import add_reasons


def turn_seed(seed: str) -> int:
    """torch's seed for a turn seeded by the string `seed` (64 bits of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")


def hf_sample_turn(
    model: Any,
    length: LengthControl,
    temperature: float,
    pad_id: int,
    filters: SamplingFilters = NO_FILTERS,
) -> SampleTurn:
    """A model turn as `EngineClient` takes one: the generators' length rules (`LengthControl`,
    with what the rollout has left) over requests sampled by HF `generate` (`hf_request`), all
    from torch's RNG seeded by the turn's seed."""

    async def sample_turn(prompt: list[int], left: Allowance, seed: str | None) -> Sample:
        request = hf_request(model, temperature, pad_id, filters)
        devices = [model.device.index or 0] if model.device.type == "cuda" else []
        # The requests of one turn never suspend (generate is synchronous), so no other
        # rollout's turn draws from the RNG between them.
        with torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(turn_seed(seed))
            return await length.sample(
                request, list(prompt), left.thinking, lambda: 0, answer_budget=left.answer
            )

    return sample_turn


def hf_request(
    model: Any, temperature: float, pad_id: int, filters: SamplingFilters = NO_FILTERS
) -> Sampler:
    """One engine request done by HF `generate`: at most `max_new` tokens after the prompt,
    ending at the first of `stop_ids` ("stop") or at the limit ("length"), with the tokens'
    log-probs after temperature and the filters; from torch's RNG as it stands."""
    sampling, processors = sampling_settings(temperature, filters)

    async def request(prompt: list[int], max_new: int, stop_ids: Sequence[int]) -> Segment:
        config = GenerationConfig(
            do_sample=True,
            num_beams=1,
            **sampling,
            max_new_tokens=max_new,
            eos_token_id=list(stop_ids),
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
        with torch.inference_mode(), plain_generation_config(model):
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                logits_processor=processors,
            )
        new: list[int] = out.sequences[0, len(prompt) :].tolist()
        ended = next((at for at, t in enumerate(new) if t in stop_ids), None)
        kept = new if ended is None else new[: ended + 1]
        logprobs = [
            float(torch.log_softmax(score[0].float(), dim=-1)[token])
            for score, token in zip(out.scores, kept, strict=False)
        ]
        return Segment(kept, logprobs, [0] * len(kept), "length" if ended is None else "stop")

    return request


@dataclass(frozen=True)
class AgentHeldOut:
    """An agent run's held-out prompts, its environment and how a turn is sampled."""

    examples: tuple[Example, ...]
    env: Any  # the verifiers Environment, contained as the generators contain it
    environment: EnvironmentSpec
    tokens: ModelTokens
    length: LengthControl  # the rollout's budgets over all its turns, as the generators'
    temperature: float
    pad_id: int
    filters: SamplingFilters = NO_FILTERS

    @classmethod
    def for_run(
        cls, run: ScaleRLRun, tokenizer: Any, model_path: str | Path, prompts: int | None = None
    ) -> AgentHeldOut:
        """The environment's held-out prompts (the first `prompts` of them, if given)."""
        spec = run.spec
        if spec.environment is None:
            raise InputError("spec.environment: not set; scalerl.hfeval.HeldOut evaluates this run")
        if prompts is not None and prompts < 1:
            raise InputError(f"prompts must be >= 1; got {prompts}")
        env = load_environment(spec)
        _, validation = environment_examples(env, spec)
        limit = model_limit(model_path)
        if limit is None:
            raise DataError(f"{model_path}: its config.json does not give the model's context")
        tokens = ModelTokens.load(model_path, tokenizer, spec.model.think_end)
        phrase = spec.interruption_phrase if spec.thinks else ""
        pad = tokenizer.pad_token_id
        return cls(
            examples=tuple(validation[:prompts] if prompts is not None else validation),
            env=env,
            environment=spec.environment,
            tokens=tokens,
            length=LengthControl(
                plan=InterruptionPlan.of(spec.recipe.length),
                think_end_id=tokens.think_end_id,
                phrase_ids=tuple(tokenizer.encode(phrase, add_special_tokens=False)),
                max_model_len=limit,
                eos_ids=tuple(sorted(tokens.eos_ids)),
            ),
            temperature=spec.recipe.sampling.temperature,
            pad_id=int(pad) if pad is not None else min(tokens.eos_ids),
            filters=SamplingFilters.of(spec.recipe.sampling),
        )

    def rollouts(self, model: Any, k: int, seed: int = 0) -> list[list[Sample]]:
        """`k` scored rollouts of each held-out prompt (less those the environment failed), in
        the order of the prompts."""
        return [played.samples for played in self.play(model, k, seed)]

    def play(self, model: Any, k: int, seed: int = 0) -> list[Played]:
        """`k` rollouts of each held-out prompt, in the order of the prompts: the scored ones
        and why each of the others was dropped."""
        if k < 1:
            raise InputError(f"k must be >= 1; got {k}")
        sample_turn = hf_sample_turn(
            model, self.length, self.temperature, self.pad_id, self.filters
        )
        length = self.length
        client = EngineClient(sample_turn, self.tokens, length.max_model_len, length.plan)
        agents = AgentRollouts(self.env, client, self.environment)

        async def play() -> list[Played]:
            return [await agents.play(e, k, f"{seed}/{e.id}") for e in self.examples]

        was_training = model.training
        model.eval()
        try:
            return asyncio.run(play())
        finally:
            model.train(was_training)

    def evaluate(
        self, model: Any, k: int, seed: int = 0, *, label: str = "", batch_rows: int = 0
    ) -> Evaluation:
        """Mean@k of `model` over the held-out prompts (`batch_rows` is unused: a turn is one
        `generate` call of one row)."""
        started = time.monotonic()
        groups = self.play(model, k, seed)
        return count(self.examples, groups, k, seed, self.temperature, label, started, self.filters)


def count(
    examples: Sequence[Example],
    groups: Sequence[Played],
    k: int,
    seed: int,
    temperature: float,
    label: str,
    started: float,
    filters: SamplingFilters = NO_FILTERS,
) -> Evaluation:
    """The evaluation of `groups` (each prompt's `k` rollouts): passed / (prompts x k), the
    rollouts that could not be scored counted as not passed."""
    # Counted as the generators count an evaluation (a dropped rollout or a raising rubric:
    # unscored, not passed).
    per_prompt = tuple(
        score(e, Group(g.samples, g.dropped), k) for e, g in zip(examples, groups, strict=True)
    )
    samples = sum(p.samples for p in per_prompt)
    if samples == 0:
        raise DataError("no held-out prompts to evaluate")
    means = [p.correct / p.samples for p in per_prompt]
    correct = sum(p.correct for p in per_prompt)
    unscored = sum(p.unscored for p in per_prompt)
    return Evaluation(
        checkpoint=label,
        k=k,
        seed=seed,
        temperature=temperature,
        filters=filters,
        per_prompt=per_prompt,
        prompts=len(per_prompt),
        samples=samples,
        correct=correct,
        truncated=sum(p.truncated for p in per_prompt),
        pass_rate=correct / samples,
        stderr=statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0,
        seconds=time.monotonic() - started,
        by_domain=domain_rates(per_prompt),
        unscored=unscored,
        unscored_reasons=add_reasons(*(p.unscored_reasons for p in per_prompt)),
    )
