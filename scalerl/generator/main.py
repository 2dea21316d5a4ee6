"""The generator process (`scalerl generator`): samples groups of completions for its shard of the
train prompts, scores them, streams them to trainer 0, swaps weights in flight when the trainer
announces a new version, and evaluates the held-out prompts when asked.

Three tasks share one event loop: producers (generate -> score -> outbox), the outbox sender (the
only writer to the channel, never blocking the loop, so backpressure stops production but never the
weight updates), and the command loop (updates, evaluations, stop).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from scalerl.environment import ProcessEnv, configure_logging, exit_now
from scalerl.errors import DataError, PeerError, ScaleRLError, WeightSyncError
from scalerl.generator.agent_setup import agent_rollouts, environment_prompts
from scalerl.generator.colocation import Colocation
from scalerl.generator.engine import GenerationEngine, prepare_vllm_environment
from scalerl.generator.engine_config import engine_config
from scalerl.generator.prompts import (
    Example,
    PromptEncoder,
    PromptOrder,
    shard,
    train_and_validation,
)
from scalerl.generator.readable import readable
from scalerl.generator.scoring import Scorer, rewards_of
from scalerl.generator.tally import Group, Tally, score
from scalerl.generator.tokens import ModelTokens
from scalerl.metrics import GeneratorMetrics
from scalerl.preflight import context_problem, model_dir_problem, model_len_needed, model_limit
from scalerl.recipe import NoPositiveResampling
from scalerl.rollout.keys import GENERATOR_FILES, StreamKeys
from scalerl.rollout.pipe import GeneratorEnd
from scalerl.rollout.position import DataPosition
from scalerl.rollout.records import (
    Conversation,
    EvalResult,
    Evaluate,
    Failure,
    MoreRollouts,
    Ready,
    Regroup,
    RolloutGroup,
    Start,
    Stop,
    UpdateWeights,
)
from scalerl.rollout.stream import GeneratorChannel
from scalerl.spec import RunSpec, ScaleRLRun, load_run
from scalerl.status.history import SANDBOX
from scalerl.sync.group import REJOIN_S

if TYPE_CHECKING:  # verifiers is imported only by a run with spec.environment
    from scalerl.agents.rollouts import AgentRollouts

log = logging.getLogger("scalerl.generator")
T = TypeVar("T")
Channel = GeneratorChannel | GeneratorEnd  # to trainer 0, or to the trainer thread (colocated)


@dataclass
class Generator:
    run: ScaleRLRun
    env: ProcessEnv
    engine: GenerationEngine
    channel: Channel
    scorer: Scorer
    tokens: ModelTokens
    prompts: PromptEncoder
    train: list[Example]
    validation: list[Example]  # this generator's share of the held-out prompts
    metrics: GeneratorMetrics
    curriculum: NoPositiveResampling = field(default_factory=NoPositiveResampling)
    # spec.environment's rollouts (scalerl.agents); None: one completion scored by data.reward.
    agents: AgentRollouts | None = None
    # The run's data position at Start: prompt id -> the epochs a training step consumed it in.
    consumed: dict[str, list[int]] = field(default_factory=dict)
    # The generators in the weight-sync group with this one (Start, Regroup): they share a batch.
    members: list[int] = field(default_factory=list)
    # Every held-out prompt: a lost generator's share is evaluated by another meanwhile.
    held_out: list[Example] = field(default_factory=list)
    # Every train prompt: the members share them out anew when one is lost or joins.
    train_all: list[Example] = field(default_factory=list)
    order: Iterator[tuple[Example, int]] = field(default_factory=lambda: iter(()))
    tally: Tally = field(init=False)

    def __post_init__(self) -> None:
        self.tally = Tally(self.metrics)

    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    new_version: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def spec(self) -> RunSpec:
        return self.run.spec

    @property
    def index(self) -> int:
        return self.env.generator_index

    # --- rollouts ------------------------------------------------------------------------------

    async def sample_group(self, example: Example, n: int, seed: str | None = None) -> Group:
        """`n` completions of the prompt, scored: those the code sandbox could not score are
        dropped (counted in sandbox_failures, their reason in `Group.dropped`); one whose reward
        raised is kept as a failure with its error (`Sample.reward_error`)."""
        if self.agents is not None:
            return await self.sample_rollouts(example, n, seed)
        self.tally.generation_begins()
        try:
            samples = await self.engine.generate(self.prompts.encode(example), n, seed=seed)
        finally:
            self.tally.generation_ends()
        started = time.perf_counter()
        answers = [(self.tokens.answer_text(s.completion_ids), example.answer) for s in samples]
        rewards = await self.scorer.score_all(answers, example.reward or None)
        group = Group([])
        for sample, reward in zip(samples, rewards, strict=True):
            if reward.value is None:
                group.dropped.append(SANDBOX)
                continue
            sample.reward = reward.value
            sample.reward_error = reward.error
            group.samples.append(sample)
        self.tally.score_s += time.perf_counter() - started
        return group

    async def sample_rollouts(self, example: Example, n: int, seed: str | None) -> Group:
        """`n` rollouts of the environment, scored by its rubric (the environment's turns count
        as generation: the engine waits on them as it would on a reward)."""
        assert self.agents is not None
        self.tally.generation_begins()
        try:
            played = await self.agents.play(example, n, seed)
        finally:
            self.tally.generation_ends()
        failures = self.agents.failures.take()
        self.tally.environment_failures += failures
        self.metrics.environment_failures.inc(failures)
        self.metrics.reward_errors.inc(sum(bool(s.reward_error) for s in played.samples))
        return Group(played.samples, list(played.dropped))

    def group_prompt(self, example: Example) -> list[int]:
        """What the trainer reads as the group's prompt."""
        if self.agents is not None:
            return self.agents.prompt_ids(example)
        return self.prompts.encode(example)

    async def produce(self, outbox: asyncio.Queue[RolloutGroup]) -> None:
        """One producer: pull the next prompt, sample its group, queue it (blocks when full).

        Several producers share one prompt order so the engine always has groups in flight.
        """
        n = self.spec.recipe.batch.generations_per_prompt
        while not self.stopped.is_set():
            await self.wait_for_quota()
            example, epoch = next(self.order)
            self.tally.begin()
            try:
                samples = (await self.sample_group(example, n)).samples
            finally:
                self.tally.end()
            if not samples:  # the sandbox failed on every completion: nothing to learn from
                self._quota_left += 1  # the group never went out: its place is free again
                continue
            group = RolloutGroup(example.id, self.group_prompt(example), samples, self.index, epoch)
            self.count(group)
            await outbox.put(group)

    def count(self, group: RolloutGroup) -> None:
        if self.spec.recipe.no_positive_resampling.enabled:
            self.curriculum.observe(group.prompt_id, group.pass_rate)
        for s in group.samples:
            self.tally.sequences += 1
            self.tally.truncated += int(s.truncated)
            self.tally.tokens += s.generated_tokens
            self.metrics.generated_sequences.inc()
            self.metrics.generated_tokens.inc(s.generated_tokens)
            self.metrics.truncated_sequences.inc(int(s.truncated))
            self.metrics.interrupted_sequences.inc(int(s.interrupted))
            if s.conversation is not None:
                self.count_conversation(s.conversation)

    def count_conversation(self, conversation: Conversation) -> None:
        t, m = self.tally, self.metrics
        t.agent_turns += conversation.turns
        t.tool_calls += conversation.tool_calls
        t.tool_errors += conversation.tool_errors
        t.environment_seconds += conversation.env_seconds
        m.agent_turns.inc(conversation.turns)
        m.tool_calls.inc(conversation.tool_calls)
        m.tool_errors.inc(conversation.tool_errors)
        m.environment_seconds.inc(conversation.env_seconds)

    # Groups this generator may still start before the trainer takes another batch. Each batch
    # the trainer takes (a new version, or MoreRollouts when it learnt nothing) grants more.
    # PPO-off-policy-k: k batches from one policy, granted anew per version. PipelineRL: one
    # batch's share per batch taken, holding at most two (one being trained on, one ahead), so
    # generation leads the trainer by about one batch whatever the number of generators;
    # anything queued beyond that would only go stale (and on a shared CPU would take cycles
    # from the trainer).
    _quota_left: int = -1

    async def wait_for_quota(self) -> None:
        while self._quota_left == 0:
            self.new_version.clear()
            await self.new_version.wait()
        self._quota_left -= 1

    def grant_quota(self, *, first: bool = False) -> None:
        recipe = self.spec.recipe
        share = math.ceil(recipe.batch.prompts / max(len(self.members), 1))
        if recipe.algorithm == "ppo-off-policy":
            self._quota_left = recipe.max_off_policy_steps * share
        elif first:
            self._quota_left = 2 * share
        else:
            self._quota_left = min(self._quota_left + share, 2 * share)
        self.new_version.set()

    async def send_outbox(self, outbox: asyncio.Queue[RolloutGroup]) -> None:
        """The only writer of rollouts: never blocks the loop while the trainer is not reading."""
        while not self.stopped.is_set():
            group = await outbox.get()
            if self.channel.try_send(group):
                continue
            waiting = time.monotonic()
            while not self.channel.try_send(group):
                await asyncio.sleep(0.005)
            self.tally.send_wait_s += time.monotonic() - waiting

    # --- commands ------------------------------------------------------------------------------

    async def update(self, command: UpdateWeights) -> None:
        try:
            seconds = await self.engine.update_weights(
                command.version, timeout_s=self.env.peer_timeout_s
            )
        except WeightSyncError as err:
            # The engine resumed on the previous weights; the trainer sees the broken broadcast
            # on its side too and forms the group again (Regroup), the current weights following.
            self.metrics.weight_sync_failures.inc()
            log.error("weight update to version %d failed: %s", command.version, err)
            return
        self.metrics.weight_sync_seconds.observe(seconds)
        self.tally.sync_s += seconds
        self.metrics.generator_policy_version.set(command.version)
        self.grant_quota()

    async def evaluate(self, command: Evaluate) -> None:
        """Sample k completions of every held-out prompt and report what each prompt scored:
        out of k, a sample that could not be scored counting as not passed."""
        k = self.spec.evaluation.generations_per_prompt
        index, examples = self.shard_of(command)
        self.tally.begin()
        try:
            groups = await asyncio.gather(
                *(self.sample_group(e, k, self.eval_seed(command, e)) for e in examples)
            )
        finally:
            self.tally.end()
        result = EvalResult(
            step=command.step,
            version=command.version,
            generator=index,
            scores=[score(e, g, k) for e, g in zip(examples, groups, strict=True)],
            tokens=sum(s.generated_tokens for g in groups for s in g.samples),
            completions=readable(
                examples,
                [g.samples for g in groups],
                self.spec.evaluation.log_completions,
                self.tokens.tokenizer.decode,
            ),
        )
        for message in (
            self.tally.report(self.index, self.engine.version),
            result,
        ):  # stats first: the trainer records both
            while not self.channel.try_send(message):
                await asyncio.sleep(0.005)

    def shard_of(self, command: Evaluate) -> tuple[int, list[Example]]:
        """Which share of the held-out prompts `command` asks for (this generator's own, or one
        of a generator lost, or of a pool scaled since) and its prompts."""
        if command.shard < 0:
            return self.index, self.validation
        count = command.shards or self.spec.generators.replicas
        return command.shard, shard(self.held_out, command.shard, count)

    def eval_seed(self, command: Evaluate, example: Example) -> str:
        """What an evaluation samples a held-out prompt with: the run's seed, the step and the
        prompt, and nothing of the process (its generator index, what it sampled before), so
        evaluation n samples alike whether or not the run restarted before it."""
        return f"{self.spec.seed}/eval/{command.step}/{example.id}"

    async def next_command(self, timeout_s: float) -> object | None:
        """Poll the channel from the loop thread (a ZeroMQ socket must stay on one thread)."""
        deadline = time.monotonic() + timeout_s
        while True:
            command = self.channel.recv(0)
            if command is not None or time.monotonic() >= deadline:
                return command
            await asyncio.sleep(0.005)

    async def wait_for(self, kind: type[T], timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            command = await self.next_command(deadline - time.monotonic())
            if isinstance(command, kind):
                return command
            if isinstance(command, Stop):
                raise PeerError(f"trainer stopped the run before {kind.__name__}: {command.reason}")
        raise PeerError(
            f"no {kind.__name__} from the trainer at {self.env.trainer_host}:"
            f"{self.env.channel_port} within {timeout_s:.0f} s"
        )

    async def command_loop(self) -> None:
        background: set[asyncio.Task[None]] = set()
        while not self.stopped.is_set():
            command = await self.next_command(0.5)
            if command is None:
                continue
            if isinstance(command, UpdateWeights):
                await self.update(command)
            elif isinstance(command, Regroup):  # a generator was lost or joins: weights follow
                try:
                    await self.join(command, REJOIN_S)
                except WeightSyncError as err:  # the trainer forms the next one without us
                    log.error("generator %d could not rejoin: %s", self.index, err)
                self.consumed = command.consumed
                self.curriculum.load_state_dict(command.curriculum)
                self.serve_shard()
            elif isinstance(command, MoreRollouts):  # colocated: new weights are in already
                self.metrics.generator_policy_version.set(self.engine.version)
                self.grant_quota()
            elif isinstance(command, Evaluate):
                task = asyncio.create_task(self.evaluate(command))
                background.add(task)
                task.add_done_callback(background.discard)
            elif isinstance(command, Stop) and command.lost:
                raise PeerError(f"the trainer gave generator {self.index} up: {command.reason}")
            elif isinstance(command, Stop):
                log.info("generator %d stopping: %s", self.index, command.reason)
                self.stopped.set()

    # --- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Hello, start the engine, take Start, join the weight-sync group, load any resumed
        weights. The trainer is contacted first so an unreachable one is reported at once. The
        engine starts from the base weights while the trainer loads its model and checkpoint:
        the trainer sends Start only once every generator said hello, and waiting for it before
        starting the engine made a gang's start the sum of the two (a resumed run's weights
        follow Start)."""
        self.channel.hello(timeout_s=self.env.startup_timeout_s)
        await self.engine.start()
        start = await self.wait_for(Start, self.env.startup_timeout_s)
        self.curriculum.load_state_dict(start.curriculum)
        self.consumed = start.consumed
        # None at all is a pool whose only generator was lost: this one replaces it.
        self.members = list(start.members)
        colocated = self.engine.colocation is not None  # weights are loaded in memory
        if not colocated and self.index not in self.members:
            await self.replace(start)  # started mid-run in place of a lost generator
        elif not colocated:
            try:
                # The others join once their engines started: a gang's start, not a silence.
                await self.join(Regroup(start.generation, self.members), self.env.startup_timeout_s)
            except WeightSyncError as err:
                # A member died as the gang started: the trainer gave the group up (or timed
                # out) and forms it of the others; the run's weights follow, whatever the version.
                log.warning("generator %d: the gang's weight-sync group did not form (%s); "
                            "waiting for the next", self.index, err)  # fmt: skip
                await self.rejoin(start)
            else:
                if start.version > 0:  # a resumed run: the checkpoint's weights follow at once
                    await self.update(
                        await self.wait_for(UpdateWeights, self.env.startup_timeout_s)
                    )
                self.check_version(start)
        else:
            if start.version > 0:  # the trainer loads the resumed weights, then says so
                await self.wait_for(MoreRollouts, self.env.startup_timeout_s)
            self.check_version(start)
        self.grant_quota(first=True)
        self.tally = Tally(self.metrics)

    async def replace(self, start: Start) -> None:
        """Ask to be let into the weight-sync group (Ready), then join it (`rejoin`)."""
        while not self.channel.try_send(Ready(generator=self.index)):
            await asyncio.sleep(0.005)
        await self.rejoin(start)

    async def rejoin(self, start: Start) -> None:
        """Join the generation the trainer forms next, from where the run stands then, and load
        the run's current weights (every formation is followed by them). A generation that does
        not form (another member died as it formed: the trainer gives it up and forms the next
        without that one) is followed by the next, within the startup timeout."""
        deadline = time.monotonic() + self.env.startup_timeout_s
        while True:
            regroup = await self.wait_for(Regroup, max(deadline - time.monotonic(), 0.0))
            self.consumed = regroup.consumed  # where the run stands now, not at its hello
            self.curriculum.load_state_dict(regroup.curriculum)
            try:
                await self.join(regroup, REJOIN_S)
                break
            except WeightSyncError as err:
                log.warning(
                    "generator %d: generation %d of the weight-sync group did not form (%s); "
                    "waiting for the next", self.index, regroup.generation, err,
                )  # fmt: skip
        await self.update(await self.wait_for(UpdateWeights, self.env.startup_timeout_s))
        if self.engine.version < start.version:
            raise WeightSyncError(f"could not load the run's weights (version {start.version})")

    def check_version(self, start: Start) -> None:
        if self.engine.version != start.version:
            raise WeightSyncError(f"could not load the resumed weights of version {start.version}")

    async def join(self, regroup: Regroup, join_timeout_s: float) -> None:
        """Join `regroup`'s generation of the weight-sync group at this generator's rank."""
        self.members = list(regroup.members)
        await self.engine.init_weight_sync(
            self.env.trainer_host,
            self.env.sync_port,
            len(self.members) + 1,
            self.members.index(self.index) + 1,
            self.env.peer_timeout_s,
            join_timeout_s=join_timeout_s,
            keys_dir=str(self.env.stream_keys) if self.env.stream_keys else None,
            generation=regroup.generation,
        )

    def serve_shard(self) -> None:
        """(Re)start the order of this generator's shard of the train prompts from the run's
        data position. The shard is its place among the members: every generator's own shard
        while all are up, a larger one while one is lost (its prompts are served meanwhile), so
        every prompt goes through each epoch once. The order of an epoch is fixed by the run's
        seed and the shard (which of how many), so a restarted gang serves the same orders."""
        if self.train_all and self.index in self.members:
            place, count = self.members.index(self.index), len(self.members)
            self.train = shard(self.train_all, place, count)
        else:
            place, count = self.index, self.spec.generators.replicas
        active = self.spec.recipe.no_positive_resampling.enabled
        served = DataPosition(self.consumed).of(e.id for e in self.train)  # this shard's part
        seed = f"{self.spec.seed}/shard-{place}-of-{count}"
        self.order = iter(
            PromptOrder(self.train, self.curriculum if active else None, seed, served)
        )

    async def run_forever(self) -> None:
        await self.start()
        recipe = self.spec.recipe
        per_generator = math.ceil(recipe.batch.prompts / self.spec.generators.replicas)
        outbox: asyncio.Queue[RolloutGroup] = asyncio.Queue(maxsize=per_generator)
        self.serve_shard()
        tasks = [asyncio.create_task(self.produce(outbox)) for _ in range(per_generator)]
        tasks.append(asyncio.create_task(self.send_outbox(outbox)))
        tasks.append(asyncio.create_task(self.command_loop()))
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        self.stopped.set()
        for task in pending:
            task.cancel()
        for task in done:
            task.result()  # re-raises a producer's error


async def serve(env: ProcessEnv) -> None:
    """The generator process: its own /metrics, the rollout stream to trainer 0, its engine."""
    # SIGTERM (the runner stopping the gang, or Kubernetes) while the engine is built: the build
    # runs no event loop, so a loop's handler would wait for it (a replacement starting as a run
    # ended held the runner up for its whole stop grace). Stop there, as a cancel.
    signal.signal(signal.SIGTERM, _cancel_now)
    run = load_run(env.spec)
    metrics = GeneratorMetrics(run.namespace, run.name)
    metrics.serve(env.metrics_port, env.bind_host)
    keys = StreamKeys.load(env.stream_keys, GENERATOR_FILES) if env.stream_keys else None
    channel = GeneratorChannel(
        f"tcp://{env.trainer_host}:{env.channel_port}", env.generator_index, keys=keys
    )
    try:
        generator = build_generator(run, env, channel, metrics)
    except BaseException:
        channel.close()
        raise
    # From here SIGTERM cancels the run, so its finally shuts the vLLM engine down instead of
    # orphaning it.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _cancel(asyncio.current_task()))
    await run_generator(generator, exiting=True)


def build_generator(
    run: ScaleRLRun,
    env: ProcessEnv,
    channel: Channel,
    metrics: GeneratorMetrics,
    colocation: Colocation | None = None,
) -> Generator:
    """A generator for this process's shard of the prompts, its engine not started yet."""
    spec = run.spec
    model = Path(spec.model.path)
    problem = model_dir_problem(model)
    if problem is not None:
        raise DataError(problem)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokens = ModelTokens.load(model, tokenizer, spec.model.think_end)
    prompts = PromptEncoder.for_data(tokenizer, spec.data, spec.recipe.length.max_prompt_tokens)
    environment = None
    if spec.environment is None:
        train, validation = train_and_validation(spec.data, spec.seed)
        # Every generator measures all prompts, so all engines get the same max_model_len.
        longest = prompts.longest(train + validation)
    else:
        environment, train, validation, longest = environment_prompts(spec, tokenizer)
    problem = context_problem(spec, tokenizer, longest)
    if problem is not None:
        raise DataError(problem)
    # A conversation grows with every turn: it may use the model's whole context.
    needed = model_len_needed(spec, tokenizer, longest)
    limit = model_limit(model) if environment is not None else None
    config = engine_config(spec, env, limit or needed)
    prepare_vllm_environment(config)
    engine = GenerationEngine(config, colocation=colocation)
    count = spec.generators.replicas
    return Generator(
        run=run,
        env=env,
        engine=engine,
        channel=channel,
        scorer=Scorer(rewards_of(spec.data.reward, train + validation), spec.data.code, metrics),
        tokens=tokens,
        prompts=prompts,
        train=shard(train, env.generator_index, count),
        validation=shard(validation, env.generator_index, count),
        held_out=validation,
        train_all=train,
        metrics=metrics,
        curriculum=NoPositiveResampling(spec.recipe.no_positive_resampling.pass_rate_threshold),
        agents=None if environment is None else agent_rollouts(spec, environment, engine, tokens),
    )


async def run_generator(generator: Generator, *, exiting: bool = False) -> None:
    """Run until the trainer says stop; a failure is told to the trainer, and the engine is shut
    down whatever happens (`exiting`: the process ends next)."""
    try:
        await generator.run_forever()
    except ScaleRLError as err:
        generator.channel.try_send(Failure(generator.index, str(err)))
        raise
    finally:
        await generator.engine.shutdown(exiting=exiting)
        generator.scorer.close()
        generator.channel.close()


def _cancel_now(signum: int, frame: object) -> None:
    raise asyncio.CancelledError


def _cancel(task: asyncio.Task[None] | None) -> Callable[[], None]:
    def cancel() -> None:
        if task is not None:
            task.cancel()

    return cancel


def main() -> None:
    env = ProcessEnv.from_environ()
    configure_logging()
    try:
        asyncio.run(serve(env))
    except asyncio.CancelledError:  # SIGTERM: serve shut the engine down
        log.info("generator %d stopped (SIGTERM)", env.generator_index)
        # Stopped from outside, its work not done: on a cluster its pod must end Failed, or its
        # Job would count the index complete and start no replacement (a pod deleted mid-run).
        exit_now(128 + signal.SIGTERM)
    # Done and shut down: leave without the interpreter's teardown of vLLM's and torch's
    # modules, seconds per gang stop (a failure above raises instead, with its traceback).
    exit_now(0)
