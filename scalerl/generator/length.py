"""Length control of one sample: thinking budget, ScaleRL's forced interruption, answer budget.

Each sample is one engine request (n = 1), and a second one only when it must:

1. The first request: `max_tokens` = the sample's cutoff (`InterruptionPlan.cutoff`, uniform in
   the window), stopping on EOS only. vLLM ends it in one of three ways:
   - EOS before `</think>`: the sample is complete (no answer);
   - `</think>` in time: the same request goes on into the answer. The answer ends with EOS
     within the cutoff (the usual case: one request), or runs into the answer budget there (the
     sample is truncated at the budget; the tokens past it are dropped), or is still going at the
     cutoff: a continuation request completes it, within what is left of the answer budget;
   - the cutoff before `</think>`: with interruption enabled, append the phrase (loss mask 0,
     log-prob 0.0, the current policy version) and go on to the answer; with it disabled the
     cutoff is the thinking budget and the sample is truncated there.
2. A continuation: a request whose prompt is the prompt plus everything so far, with `max_tokens`
   = what is left of the answer budget and no stop token but EOS. Hitting it means truncated.

Every token is sampled from the policy given everything before it, so this is the distribution
of "think, then answer within the budgets" exactly; going on past `</think>` in the same request
only saves the continuation's prefill and scheduling (on a small model, a third of a batch's
generation time). Why not one long request checked afterwards: it cannot enforce the answer
budget after an early `</think>` without wasting everything past it, nor inject the phrase.
A continuation re-reads the prefix, which vLLM's prefix cache mostly serves from blocks it
already holds. One request per sample (rather than one with `n` samples) lets every sample have
its own cutoff; vLLM fans an `n` request out into `n` requests internally anyway.

A model that does not think (`think_end_id` None) has one phase: one request of at most
`answer_budget` tokens. Every request also stops on the model's EOS ids (all of them: tokenizer
and generation config), so a completion ends where the model says it ends.

`max_model_len` caps every request: a sample that runs into it is truncated.

A conversation (scalerl.agents) samples each model turn under these rules with what its rollout
has left (`Allowance`): its turns share one cutoff and one answer budget, so a turn may think for
what earlier turns left of the cutoff. A turn that starts with none left is interrupted at once:
the phrase, then its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from scalerl.errors import InputError
from scalerl.recipe.interruption import InterruptionPlan, splice
from scalerl.rollout.records import Sample


@dataclass(frozen=True)
class Segment:
    """What one engine request (n = 1) produced: tokens, their log-probs and policy versions."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # vLLM's: "stop" (EOS or a stop token) or "length"

    def split(self, at: int) -> tuple[Segment, Segment]:
        """The first `at` tokens (cut there: finish "length") and the rest (this finish)."""
        head = Segment(self.token_ids[:at], self.logprobs[:at], self.versions[:at], "length")
        tail = Segment(
            self.token_ids[at:], self.logprobs[at:], self.versions[at:], self.finish_reason
        )
        return head, tail

    def then(self, more: Segment) -> Segment:
        """This segment continued by `more` (its finish is the end's)."""
        return Segment(
            self.token_ids + more.token_ids,
            self.logprobs + more.logprobs,
            self.versions + more.versions,
            more.finish_reason,
        )


# (prompt ids, max new tokens, stop token ids) -> the request's output.
Sampler = Callable[[list[int], int, Sequence[int]], Awaitable[Segment]]


@dataclass(frozen=True)
class Allowance:
    """What a sample may still spend: thinking tokens before its cutoff, and answer tokens."""

    thinking: int
    answer: int

    def after(self, sample: Sample, think_end_id: int | None) -> Allowance:
        """What is left once `sample` is spent: the tokens the policy sampled up to and
        including the first `</think>` (its own or the phrase's) are thinking, the rest answer;
        a model that does not think only answers."""
        sampled = sum(sample.loss_mask)
        ids = sample.completion_ids
        if think_end_id is None:
            thinking = 0
        elif think_end_id in ids:
            thinking = sum(sample.loss_mask[: ids.index(think_end_id) + 1])
        else:
            thinking = sampled  # still thinking when it ended
        return Allowance(self.thinking - thinking, self.answer - (sampled - thinking))


_NOTHING = Segment([], [], [], "length")  # an answer not begun yet


@dataclass
class _Completion:
    """A completion being assembled from segments and injected text."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def add(self, segment: Segment) -> None:
        self.ids += segment.token_ids
        self.logprobs += segment.logprobs
        self.versions += segment.versions
        self.loss_mask += [1] * len(segment.token_ids)

    def inject(self, phrase_ids: Sequence[int], version: int) -> None:
        """Append text the policy did not sample, so it has no log-prob and is not trained on."""
        before = len(self.ids)
        self.ids, mask = splice(self.ids, phrase_ids)
        self.loss_mask += mask[before:]  # the recipe's rule: 0 on the phrase
        self.logprobs += [0.0] * len(phrase_ids)
        self.versions += [version] * len(phrase_ids)

    def finish(self, reason: str, *, truncated: bool, interrupted: bool) -> Sample:
        return Sample(
            completion_ids=self.ids,
            logprobs=self.logprobs,
            versions=self.versions,
            loss_mask=self.loss_mask,
            reward=0.0,
            truncated=truncated,
            interrupted=interrupted,
            finish_reason=reason,
        )


@dataclass(frozen=True)
class LengthControl:
    """The token budgets of one engine and the ids its tokenizer gives the marker strings."""

    plan: InterruptionPlan
    think_end_id: int | None  # None: the model does not think
    phrase_ids: tuple[int, ...]
    max_model_len: int
    eos_ids: tuple[int, ...] = ()

    async def sample(
        self,
        sampler: Sampler,
        prompt_ids: list[int],
        cutoff: int,
        version: Callable[[], int],
        answer_budget: int | None = None,
    ) -> Sample:
        """One sample under the scheme of the module doc; `version()` stamps the injected
        phrase with the policy version current when it is injected. `answer_budget`: the plan's
        unless a conversation has less left."""
        answer_budget = self.plan.answer_budget if answer_budget is None else answer_budget
        if self.think_end_id is None:
            return await self.sample_plain(sampler, prompt_ids, answer_budget)
        out = _Completion()
        if cutoff <= 0:  # a turn whose conversation has spent its thinking
            if not self.plan.enabled:
                raise InputError("no thinking tokens left, and interruption is disabled")
            out.inject(self.phrase_ids, version())
            return await self._answer(
                sampler, prompt_ids, out, _NOTHING, answer_budget, interrupted=True
            )
        first = await sampler(prompt_ids, self._room(prompt_ids, out, cutoff), self.eos_ids)
        if self.think_end_id in first.token_ids:  # closed in time: the rest is the answer's
            thinking, answer = first.split(first.token_ids.index(self.think_end_id) + 1)
            out.add(thinking)
            return await self._answer(
                sampler, prompt_ids, out, answer, answer_budget, interrupted=False
            )
        out.add(first)
        if first.finish_reason == "stop":
            return out.finish("stop", truncated=False, interrupted=False)  # EOS while thinking
        cut_at_plan = len(first.token_ids) >= cutoff
        if not (self.plan.enabled and cut_at_plan):
            return out.finish("length", truncated=True, interrupted=False)
        out.inject(self.phrase_ids, version())
        return await self._answer(
            sampler, prompt_ids, out, _NOTHING, answer_budget, interrupted=True
        )

    async def _answer(
        self,
        sampler: Sampler,
        prompt_ids: list[int],
        out: _Completion,
        begun: Segment,
        budget: int,
        *,
        interrupted: bool,
    ) -> Sample:
        """The answer after the thinking in `out`: `begun` (what the thinking request already
        sampled of it) completed by a continuation if it was cut short, within `budget`."""
        room = self._room(prompt_ids, out, budget)
        if room <= 0:
            return out.finish("length", truncated=True, interrupted=interrupted)
        answer = begun
        if len(answer.token_ids) > room:  # ran past the budget within the cutoff
            answer = answer.split(room)[0]
        elif answer.finish_reason == "length" and len(answer.token_ids) < room:
            so_far = prompt_ids + out.ids + answer.token_ids
            answer = answer.then(await sampler(so_far, room - len(answer.token_ids), self.eos_ids))
        out.add(answer)
        truncated = answer.finish_reason == "length"
        return out.finish(answer.finish_reason, truncated=truncated, interrupted=interrupted)

    async def sample_plain(
        self, sampler: Sampler, prompt_ids: list[int], max_tokens: int
    ) -> Sample:
        """One sample of at most `max_tokens` tokens with no thinking/answer structure."""
        out = _Completion()
        segment = await sampler(prompt_ids, self._room(prompt_ids, out, max_tokens), self.eos_ids)
        out.add(segment)
        truncated = segment.finish_reason == "length"
        return out.finish(segment.finish_reason, truncated=truncated, interrupted=False)

    def _room(self, prompt_ids: list[int], out: _Completion, wanted: int) -> int:
        """New tokens allowed: `wanted`, capped by what is left of `max_model_len`."""
        left = self.max_model_len - len(prompt_ids) - len(out.ids)
        if not out.ids and left <= 0:
            raise InputError(
                f"prompt of {len(prompt_ids)} tokens leaves no room for a completion within "
                f"max_model_len {self.max_model_len}"
            )
        return min(wanted, left)
