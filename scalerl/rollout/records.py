"""Messages between generators and the trainer, and their one wire format.

Every message is a dataclass with `to_msg()` / `from_msg()` converting to and from plain
msgpack-able dicts tagged with a "type" field; `encode` / `decode` are the only entry points the
transport uses, so the sender and receiver of each message live here together.

Per-token data is kept compact: token ids are lists of ints (msgpack spends 1-5 bytes each),
log-probs travel as packed little-endian float32 bytes (they are float32 in the engine anyway),
and the per-token policy versions and loss mask are run-length encoded as flat
`[value, count, value, count, ...]` lists (they change a few times per sequence at most).
"""

from __future__ import annotations

import types
import typing
from dataclasses import Field, dataclass, field, fields
from typing import Any, ClassVar, Self

import msgpack
import numpy as np

from scalerl.errors import InputError
from scalerl.status.history import PromptScore


def _run_lengths(values: list[int]) -> list[int]:
    """[7, 7, 7, 8] -> [7, 3, 8, 1]."""
    runs: list[int] = []
    for value in values:
        if runs and runs[-2] == value:
            runs[-1] += 1
        else:
            runs += [value, 1]
    return runs


def _expand(runs: Any, what: str) -> list[int]:
    if not isinstance(runs, list) or len(runs) % 2:
        raise InputError(f"{what}: expected a flat [value, count, ...] list")
    values: list[int] = []
    for value, count in zip(runs[::2], runs[1::2], strict=True):
        if not _is_int(value) or not _is_int(count) or count < 1:
            raise InputError(f"{what}: bad run ({value!r}, {count!r})")
        values += [value] * count
    return values


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(msg: dict[str, Any], name: str, kind: str) -> Any:
    if name not in msg:
        raise InputError(f"{kind} message lacks the field {name!r}")
    return msg[name]


def _check(value: Any, hint: Any, where: str) -> Any:
    """Checks a scalar field against its annotation; ints are accepted where floats are due."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is float and (isinstance(value, float) or _is_int(value)):
            return float(value)
        if option is int and _is_int(value):
            return value
        if option in (str, bool) and isinstance(value, option):
            return value
        if typing.get_origin(option) is dict and isinstance(value, dict):
            return value
        if option == list[int] and isinstance(value, list) and all(map(_is_int, value)):
            return value
    raise InputError(f"{where}: expected {hint}, got {value!r}")


class _Plain:
    """to_msg/from_msg for messages made only of scalar fields."""

    TYPE: ClassVar[str]

    def to_msg(self) -> dict[str, Any]:
        return {"type": self.TYPE, **{f.name: getattr(self, f.name) for f in _fields_of(self)}}

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Self:
        hints = typing.get_type_hints(cls)
        values = {
            f.name: _check(_field(msg, f.name, cls.TYPE), hints[f.name], f"{cls.TYPE}.{f.name}")
            for f in _fields_of(cls)
        }
        return cls(**values)


def _fields_of(obj: Any) -> tuple[Field[Any], ...]:
    return fields(obj)


@dataclass
class Conversation:
    """What a multi-turn rollout (scalerl.agents) adds to its sample: how many model turns, tool
    calls and tool errors it had, the environment's wall time, and where the chat template did
    not keep the prefix, so the trainer reads the rollout as several sequences."""

    turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0
    env_seconds: float = 0.0
    env_tokens: int = 0  # the environment's messages (tool results, feedback) and their framing
    # (offset into the sample's tokens, the context re-rendered there): from `offset` on, the
    # tokens continue that context rather than everything before them (scalerl.agents.assemble).
    breaks: list[tuple[int, list[int]]] = field(default_factory=list)

    def to_msg(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "env_seconds": float(self.env_seconds),
            "env_tokens": self.env_tokens,
            "breaks": [[offset, list(ids)] for offset, ids in self.breaks],
        }

    @classmethod
    def from_msg(cls, msg: Any) -> Conversation:
        if not isinstance(msg, dict):
            raise InputError("sample.conversation: expected a map")
        where = "sample.conversation"
        breaks = _field(msg, "breaks", where)
        if not isinstance(breaks, list) or not all(_is_break(b) for b in breaks):
            raise InputError(f"{where}.breaks: expected [[offset, [token ids]], ...]")
        return cls(
            turns=_check(_field(msg, "turns", where), int, f"{where}.turns"),
            tool_calls=_check(_field(msg, "tool_calls", where), int, f"{where}.tool_calls"),
            tool_errors=_check(_field(msg, "tool_errors", where), int, f"{where}.tool_errors"),
            env_seconds=_check(_field(msg, "env_seconds", where), float, f"{where}.env_seconds"),
            env_tokens=_check(_field(msg, "env_tokens", where), int, f"{where}.env_tokens"),
            breaks=[(offset, ids) for offset, ids in breaks],
        )


def _is_break(value: Any) -> bool:
    """[offset >= 0, [token id, ...]] with at least one token id."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    offset, ids = value
    tokens = isinstance(ids, list) and bool(ids) and all(map(_is_int, ids))
    return _is_int(offset) and offset >= 0 and tokens


@dataclass
class Sample:
    """One completion of a prompt, with what the trainer needs per token.

    A multi-turn rollout is one sample too: its model turns and the environment's messages
    between them, in order, the latter with loss mask 0 (`conversation` says more)."""

    completion_ids: list[int]
    # The generator's log-probs of the sampled tokens, after temperature and the sampling filters.
    logprobs: list[float]
    versions: list[int]  # the policy version that produced each token
    loss_mask: list[int]  # 0 for tokens we injected (interruption phrase, environment messages)
    reward: float
    truncated: bool  # hit the length limit without finishing
    interrupted: bool  # the thinking budget ran out and the interruption phrase was forced
    finish_reason: str
    # An environment's rollouts pass at a reward of at least this (spec.environment.passThreshold);
    # None: single-answer rewards, which pass above 0.
    pass_threshold: float | None = None
    conversation: Conversation | None = None
    # Set when the reward could not be computed: the reward function or the environment's rubric
    # raised (what it said). `reward` is then the failure value it was given, and the sample never
    # passes: a policy must gain nothing by making its reward raise. Counted (reward_errors) in
    # training and unscored in evaluations.
    reward_error: str = ""

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def passed(self) -> bool:
        """The one definition of a pass (train, held-out, curriculum): a reward of at least the
        environment's threshold (above 0 without one) for a completion that finished within its
        budgets. A truncated sample fails, whatever its reward: it is left out of training, and
        counting it would reward running long. So does one whose reward raised."""
        if self.truncated or self.reward_error:
            return False
        if self.pass_threshold is None:
            return self.reward > 0
        return self.reward >= self.pass_threshold

    @property
    def generated_tokens(self) -> int:
        """Tokens the generator wrote (the model's and an injected phrase), not the
        environment's: what the length budgets and the token counts are about."""
        env = self.conversation.env_tokens if self.conversation else 0
        return len(self.completion_ids) - env

    def pieces(self, prompt_ids: list[int]) -> list[tuple[list[int], slice]]:
        """The sequences the trainer reads this sample as: (context, span of the sample's
        tokens) pairs. One, `prompt_ids` and everything, unless the chat template broke the
        prefix of a conversation (`Conversation.breaks`)."""
        starts = list(self.conversation.breaks) if self.conversation else []
        if not starts or starts[0][0] > 0:
            starts.insert(0, (0, prompt_ids))
        ends = [offset for offset, _ in starts[1:]] + [len(self.completion_ids)]
        return [(ids, slice(o, end)) for (o, ids), end in zip(starts, ends, strict=True)]

    def _check_lengths(self) -> None:
        lengths = {len(self.logprobs), len(self.versions), len(self.loss_mask)}
        if lengths != {len(self.completion_ids)}:
            raise InputError(
                f"sample has {len(self.completion_ids)} tokens but {len(self.logprobs)} logprobs, "
                f"{len(self.versions)} versions and {len(self.loss_mask)} loss-mask entries"
            )
        offsets = [o for o, _ in self.conversation.breaks] if self.conversation else []
        if offsets != sorted(set(offsets)) or any(o >= len(self.completion_ids) for o in offsets):
            raise InputError(
                f"sample.conversation.breaks: offsets {offsets} must increase and lie within "
                f"the sample's {len(self.completion_ids)} tokens"
            )

    def to_msg(self) -> dict[str, Any]:
        self._check_lengths()
        msg = {
            "completion_ids": list(self.completion_ids),
            "logprobs": np.asarray(self.logprobs, dtype="<f4").tobytes(),
            "versions": _run_lengths(self.versions),
            "loss_mask": _run_lengths(self.loss_mask),
            "reward": float(self.reward),
            "truncated": bool(self.truncated),
            "interrupted": bool(self.interrupted),
            "finish_reason": str(self.finish_reason),
        }
        # Only where set, so single-answer samples cost nothing more on the wire.
        if self.pass_threshold is not None:
            msg["pass_threshold"] = float(self.pass_threshold)
        if self.conversation is not None:
            msg["conversation"] = self.conversation.to_msg()
        if self.reward_error:
            msg["reward_error"] = self.reward_error
        return msg

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Sample:
        ids = _field(msg, "completion_ids", "sample")
        packed = _field(msg, "logprobs", "sample")
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise InputError("sample.completion_ids: expected a list of ints")
        if not isinstance(packed, bytes) or len(packed) % 4:
            raise InputError("sample.logprobs: expected packed float32 bytes")
        threshold = msg.get("pass_threshold")
        conversation = msg.get("conversation")
        sample = cls(
            completion_ids=ids,
            logprobs=np.frombuffer(packed, dtype="<f4").tolist(),
            versions=_expand(_field(msg, "versions", "sample"), "sample.versions"),
            loss_mask=_expand(_field(msg, "loss_mask", "sample"), "sample.loss_mask"),
            reward=_check(_field(msg, "reward", "sample"), float, "sample.reward"),
            truncated=_check(_field(msg, "truncated", "sample"), bool, "sample.truncated"),
            interrupted=_check(_field(msg, "interrupted", "sample"), bool, "sample.interrupted"),
            finish_reason=_check(_field(msg, "finish_reason", "sample"), str, "sample.finish"),
            pass_threshold=_check(threshold, float | None, "sample.pass_threshold"),
            conversation=None if conversation is None else Conversation.from_msg(conversation),
            reward_error=_check(msg.get("reward_error", ""), str, "sample.reward_error"),
        )
        sample._check_lengths()
        return sample


@dataclass
class RolloutGroup:
    """All samples of one prompt, from one generator (generator -> trainer)."""

    TYPE: ClassVar[str] = "rollout_group"
    prompt_id: str
    prompt_ids: list[int]
    samples: list[Sample]
    generator: int
    epoch: int = 0  # the epoch of the data it was served in (scalerl.rollout.position)

    @property
    def min_version(self) -> int:
        """Oldest policy version behind any token of the group (its off-policyness)."""
        return min(min(s.versions) for s in self._with_tokens())

    @property
    def max_version(self) -> int:
        return max(max(s.versions) for s in self._with_tokens())

    @property
    def pass_rate(self) -> float:
        """Fraction of samples that passed (`Sample.passed`; 0.0 for no samples)."""
        if not self.samples:
            return 0.0
        return sum(s.passed for s in self.samples) / len(self.samples)

    @property
    def completion_tokens(self) -> int:
        return sum(s.generated_tokens for s in self.samples)

    def _with_tokens(self) -> list[Sample]:
        found = [s for s in self.samples if s.versions]
        if not found:
            raise InputError(f"rollout group {self.prompt_id!r} has no generated tokens")
        return found

    def to_msg(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "prompt_id": self.prompt_id,
            "prompt_ids": list(self.prompt_ids),
            "samples": [s.to_msg() for s in self.samples],
            "generator": self.generator,
            "epoch": self.epoch,
        }

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> RolloutGroup:
        kind = cls.TYPE
        prompt_ids = _field(msg, "prompt_ids", kind)
        samples = _field(msg, "samples", kind)
        if not isinstance(prompt_ids, list) or not all(_is_int(i) for i in prompt_ids):
            raise InputError(f"{kind}.prompt_ids: expected a list of ints")
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise InputError(f"{kind}.samples: expected a list of samples")
        return cls(
            prompt_id=_check(_field(msg, "prompt_id", kind), str, f"{kind}.prompt_id"),
            prompt_ids=prompt_ids,
            samples=[Sample.from_msg(s) for s in samples],
            generator=_check(_field(msg, "generator", kind), int, f"{kind}.generator"),
            epoch=_check(_field(msg, "epoch", kind), int, f"{kind}.epoch"),
        )


@dataclass
class EvalResult:
    """One generator's share of an evaluation on held-out prompts (generator -> trainer): what
    each of its prompts scored, and a few completions for a person to read when asked."""

    TYPE: ClassVar[str] = "eval_result"
    step: int
    version: int
    generator: int
    scores: list[PromptScore]
    tokens: int
    completions: list[dict[str, Any]] = field(default_factory=list)

    def to_msg(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "step": self.step,
            "version": self.version,
            "generator": self.generator,
            "scores": [
                [
                    s.prompt_id,
                    s.samples,
                    s.correct,
                    s.truncated,
                    s.domain,
                    s.unscored,
                    dict(s.unscored_reasons),
                ]
                for s in self.scores
            ],
            "tokens": self.tokens,
            "completions": list(self.completions),
        }

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> EvalResult:
        kind = cls.TYPE
        rows = _field(msg, "scores", kind)
        completions = _field(msg, "completions", kind)
        if not isinstance(rows, list) or not all(_is_score(r) for r in rows):
            raise InputError(
                f"{kind}.scores: expected [prompt id, samples, correct, truncated, domain, "
                "unscored, {reason: count}] with correct + unscored <= samples"
            )
        if not isinstance(completions, list) or not all(isinstance(c, dict) for c in completions):
            raise InputError(f"{kind}.completions: expected a list of maps")
        return cls(
            step=_check(_field(msg, "step", kind), int, f"{kind}.step"),
            version=_check(_field(msg, "version", kind), int, f"{kind}.version"),
            generator=_check(_field(msg, "generator", kind), int, f"{kind}.generator"),
            scores=[PromptScore(*row) for row in rows],
            tokens=_check(_field(msg, "tokens", kind), int, f"{kind}.tokens"),
            completions=completions,
        )


def _is_score(row: Any) -> bool:
    if not (isinstance(row, list) and len(row) == 7 and isinstance(row[0], str)):
        return False
    if not isinstance(row[4], str):
        return False
    samples, correct, truncated, unscored, reasons = row[1:4] + row[5:]
    counts = all(_is_int(v) and v >= 0 for v in (samples, correct, truncated, unscored))
    if not counts or correct + unscored > samples or truncated > samples:
        return False
    return (
        isinstance(reasons, dict)
        and all(isinstance(r, str) and _is_int(n) and n > 0 for r, n in reasons.items())
        and sum(reasons.values()) == unscored
    )


@dataclass
class GeneratorStats(_Plain):
    """Counters since the generator started (generator -> trainer, now and then)."""

    TYPE: ClassVar[str] = "generator_stats"
    generator: int
    version: int
    generated_tokens: int
    generated_sequences: int
    truncated_sequences: int
    idle_seconds: float  # waiting for weights or for the trainer to take rollouts
    weight_sync_seconds: float
    uptime_seconds: float  # since the generator started generating
    score_seconds: float  # computing rewards
    send_wait_seconds: float  # rollouts ready but the trainer not reading (backpressure)
    # groups in flight, none in the engine: all waiting for their rewards (code tests)
    reward_wait_seconds: float = 0.0
    # spec.environment's rollouts (scalerl.agents): model turns, tool calls and errors, the
    # environment's seconds, rollouts dropped because the environment failed.
    agent_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    environment_seconds: float = 0.0
    environment_failures: int = 0

    def counts(self) -> dict[str, float]:
        """What this generator process adds to the run's totals (the history's `generation`):
        samples and tokens, and with an environment its agent counters. A replaced process's
        stay in the totals, all of them, so the counters keep agreeing with each other."""
        counts: dict[str, float] = {
            "generated_samples": self.generated_sequences,
            "generated_tokens": self.generated_tokens,
        }
        if self.agent_turns:
            counts |= {name: getattr(self, name) for name in AGENT_COUNTS}
        return counts


# GeneratorStats' counters of spec.environment's rollouts, under the same names in the totals.
AGENT_COUNTS = (
    "agent_turns",
    "tool_calls",
    "tool_errors",
    "environment_seconds",
    "environment_failures",
)


@dataclass
class Hello(_Plain):
    """First message of a generator; the trainer learns its index (generator -> trainer)."""

    TYPE: ClassVar[str] = "hello"
    generator: int
    pid: int
    host: str = ""  # its machine's name: in a cluster, its pod's


@dataclass
class Failure(_Plain):
    """The generator hit an error it cannot recover from (generator -> trainer)."""

    TYPE: ClassVar[str] = "failure"
    generator: int
    message: str


@dataclass
class Start(_Plain):
    """Where the run stands, sent to each generator after its Hello (trainer -> one generator):
    the policy version and step to resume from, that generator's curriculum state and the run's
    data position (scalerl.rollout.position: prompt id -> epochs consumed; for a generator that
    replaces one mid-run, also the groups the trainer holds and has not consumed yet).

    `members`: the generators of the weight-sync group's `generation` that the trainer forms now
    (a gang's start: every generator). One not among them (a replacement) says Ready once its
    engine is up and is let in by a Regroup."""

    TYPE: ClassVar[str] = "start"
    version: int
    step: int
    curriculum: dict[str, Any] = field(default_factory=dict)
    consumed: dict[str, list[int]] = field(default_factory=dict)
    generation: int = 0
    members: list[int] = field(default_factory=list)


@dataclass
class Ready(_Plain):
    """A generator that started mid-run has its engine up: let it into the weight-sync group
    (generator -> trainer)."""

    TYPE: ClassVar[str] = "ready"
    generator: int


@dataclass
class Regroup(_Plain):
    """Join `generation` of the weight-sync group, whose receivers are `members` in this order
    (rank 1 onwards); the current weights follow (trainer -> each member). Sent when a generator
    died or one joins: the members also share the batch and the train prompts among
    themselves."""

    TYPE: ClassVar[str] = "regroup"
    generation: int
    members: list[int]
    # As in Start: the members share the train prompts out anew from where the run stands.
    curriculum: dict[str, Any] = field(default_factory=dict)
    consumed: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Ping(_Plain):
    """Nothing to do: the trainer checks that a generator is still connected (a send to one
    that is gone fails at once)."""

    TYPE: ClassVar[str] = "ping"


@dataclass
class UpdateWeights(_Plain):
    """Pause, receive `version` from the sync group, resume on it (trainer -> all)."""

    TYPE: ClassVar[str] = "update_weights"
    version: int


@dataclass
class MoreRollouts(_Plain):
    """The trainer took a batch but the policy did not change (every group was filtered out):
    generate the next batch on the same weights (trainer -> all). No weights follow."""

    TYPE: ClassVar[str] = "more_rollouts"
    version: int


@dataclass
class Evaluate(_Plain):
    """Run the held-out prompts with the current weights and answer EvalResult: the generator's
    own share, or with `shard` >= 0 share `shard` of `shards` (the trainer's division, which
    outlives the generators: one lost, or a pool scaled while it runs)."""

    TYPE: ClassVar[str] = "evaluate"
    step: int
    version: int
    shard: int = -1
    shards: int = 0  # 0: spec.generators.replicas


@dataclass
class Stop(_Plain):
    """Finish up and exit (trainer -> all). `lost`: the trainer gave this generator up (it sent
    nothing for the peer timeout while the others did): exit failed, so that it is replaced."""

    TYPE: ClassVar[str] = "stop"
    reason: str
    lost: bool = False


FromGenerator = RolloutGroup | EvalResult | GeneratorStats | Hello | Failure | Ready
ToGenerator = Start | Regroup | Ping | UpdateWeights | MoreRollouts | Evaluate | Stop
Message = FromGenerator | ToGenerator
MESSAGE_TYPES: dict[str, Any] = {cls.TYPE: cls for cls in typing.get_args(Message)}


def encode(msg: Message) -> bytes:
    """The bytes of one message on the wire."""
    if type(msg) not in MESSAGE_TYPES.values():
        raise InputError(f"cannot encode {type(msg).__name__}: not a message type")
    data: bytes = msgpack.packb(msg.to_msg(), use_bin_type=True)
    return data


def decode(data: bytes) -> Message:
    """The message in `data`; InputError when it is not one of ours."""
    try:
        msg = msgpack.unpackb(data, raw=False)
    except Exception as err:  # msgpack raises several unrelated types for bad bytes
        raise InputError(f"undecodable message ({len(data)} bytes): {err}") from err
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise InputError("message is not a map with a 'type' field")
    cls = MESSAGE_TYPES.get(msg["type"])
    if cls is None:
        raise InputError(f"unknown message type {msg['type']!r}; known: {sorted(MESSAGE_TYPES)}")
    result: Message = cls.from_msg(msg)
    return result
