"""From a rollout's model turns to one training sample (token in, token out).

Each model turn was sampled from a context the chat template rendered (the turn's prompt). The
turns merge into one sequence while each context extends the one before it: everything so far
(the previous context and what the model wrote) is a prefix of the next context, so what lies
between is the environment's message, kept in the sample with loss mask 0. Where the template did
not keep the prefix (it dropped a past `<think>` block, or re-tokenized the model's text
differently), the next turn starts a new piece whose context is the re-rendered one: the trainer
reads the sample as several sequences (`Sample.pieces`), and no token is trained on a context the
policy did not see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl.rollout.records import Conversation, Sample


@dataclass(frozen=True)
class Turn:
    """One model call of a rollout: the context it was given and what it sampled."""

    prompt_ids: list[int]
    sample: Sample  # the engine's: tokens, log-probs, versions, loss mask, finish


@dataclass
class Assembled:
    """A rollout's tokens after its prompt, as `Sample` holds them."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    breaks: list[tuple[int, list[int]]] = field(default_factory=list)
    env_tokens: int = 0

    def add_environment(self, ids: list[int], version: int) -> None:
        """Tokens the policy did not sample: no log-prob, not trained; stamped with the version
        of the token before them so they never make a sample look older than it is."""
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.env_tokens += len(ids)

    def add_model(self, sample: Sample) -> None:
        self.ids += sample.completion_ids
        self.logprobs += sample.logprobs
        self.versions += sample.versions
        self.loss_mask += sample.loss_mask


def assemble(turns: list[Turn], prompt_ids: list[int]) -> Assembled:
    """The sample of `turns`, whose group's prompt is `prompt_ids` (module doc)."""
    out = Assembled()
    context = list(prompt_ids)
    for turn in turns:
        if not turn.sample.completion_ids:
            continue  # nothing sampled: nothing to train, and no piece may be empty
        extends = turn.prompt_ids[: len(context)] == context
        if extends:
            version = out.versions[-1] if out.versions else turn.sample.versions[0]
            out.add_environment(turn.prompt_ids[len(context) :], version)
        else:
            out.breaks.append((len(out.ids), list(turn.prompt_ids)))
        out.add_model(turn.sample)
        context = turn.prompt_ids + turn.sample.completion_ids
    return out


def to_sample(
    turns: list[Turn],
    prompt_ids: list[int],
    *,
    reward: float,
    truncated: bool,
    pass_threshold: float,
    stats: Conversation,
) -> Sample:
    """The rollout as the one sample the trainer receives (`stats`: its counts; breaks and
    environment tokens are filled in here)."""
    out = assemble(turns, prompt_ids)
    last = turns[-1].sample
    stats.breaks, stats.env_tokens = out.breaks, out.env_tokens
    return Sample(
        completion_ids=out.ids,
        logprobs=out.logprobs,
        versions=out.versions,
        loss_mask=out.loss_mask,
        reward=reward,
        truncated=truncated,
        interrupted=any(t.sample.interrupted for t in turns),
        finish_reason="length" if truncated else last.finish_reason,
        pass_threshold=pass_threshold,
        conversation=stats,
    )
