"""The trainer's loop on rank 0 (`Trainer`): it takes rollout groups from the generators, builds
batches with the recipe, steps, publishes each new version, has the generators evaluate,
checkpoints, and records progress. `scalerl.trainer.main` builds it and runs the process."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from scalerl.environment import ProcessEnv
from scalerl.errors import PeerError, ScaleRLError, WeightSyncError
from scalerl.metrics import TrainerMetrics
from scalerl.recipe import Correction, NoPositiveResampling
from scalerl.rollout.pipe import TrainerEnd
from scalerl.rollout.position import DataPosition
from scalerl.rollout.records import (
    EvalResult,
    Evaluate,
    Failure,
    GeneratorStats,
    Hello,
    MoreRollouts,
    Ready,
    RolloutGroup,
    Start,
    Stop,
)
from scalerl.rollout.stream import TrainerChannel
from scalerl.spec import EPSILON_HIGH, EPSILON_LOW, EPSILON_MAX, RunSpec, ScaleRLRun
from scalerl.status import StatusSink
from scalerl.status.history import (
    HeldOut,
    HistoryRow,
    Progress,
    RunFiles,
    TrainSummary,
    reasons_text,
)
from scalerl.sync.group import RanksMissing
from scalerl.tracking import TrackerSink
from scalerl.tracking import names as tracked
from scalerl.trainer.batch import BatchStats, build_batch
from scalerl.trainer.checkpoint import (
    save_checkpoint,
)
from scalerl.trainer.history import ComputeClock, TrainerState
from scalerl.trainer.policy import Policy
from scalerl.trainer.pool import ElasticPool, Pool
from scalerl.trainer.profile import Phases
from scalerl.trainer.publish import WeightPublisher
from scalerl.trainer.shard import (
    Ranks,
)
from scalerl.trainer.step import StepResult, StepSettings, train_step

log = logging.getLogger("scalerl.trainer")


@dataclass
class Trainer(ElasticPool):
    run: ScaleRLRun
    env: ProcessEnv
    policy: Policy
    optimizer: Any
    scheduler: Any
    state: TrainerState
    status: StatusSink
    metrics: TrainerMetrics
    channel: TrainerChannel | TrainerEnd
    clock: ComputeClock
    publisher: WeightPublisher  # where new policy versions go, and how a step gets the device
    ranks: Ranks = field(default_factory=Ranks)
    backlog: list[RolloutGroup] = field(default_factory=list)
    results: list[EvalResult] = field(default_factory=list)
    # The run's one curriculum, observing what steps consume (generators hold copies).
    curriculum: NoPositiveResampling = field(default_factory=NoPositiveResampling)
    train: TrainSummary | None = None  # the last training step's batch and update
    no_signal: str | None = None  # why the last step learnt nothing (None: it learnt)
    generator_stats: dict[int, GeneratorStats] = field(default_factory=dict)
    no_signal_streak: int = 0  # consecutive steps with nothing to learn from
    broadcast_version: int = -1  # the policy version the generators were last sent
    phases: Phases = field(default_factory=Phases)
    steady_seconds: float = 0.0  # `Phases.steady()` at the end of the last step
    # The generators' totals of earlier attempts, as the checkpoint this attempt resumed saved.
    generation_spent: dict[str, float] = field(default_factory=dict)
    tracker: TrackerSink | None = None  # spec.tracking's experiment trackers (None: none)
    stepped: tuple[list[RolloutGroup], BatchStats, StepResult] | None = None  # the last update
    sync_seconds: float | None = None  # the last weight broadcast's
    tracked_step: int = -1  # the last step sent to the trackers
    saved: tuple[int, int] = (-1, -1)  # (step, evaluations) the last checkpoint holds
    pool: Pool = field(default_factory=lambda: Pool.of(1))  # the generators (scalerl.trainer.pool)
    reported: tuple[bool, str, str] | None = None  # the Degraded condition as last written

    @property
    def spec(self) -> RunSpec:
        return self.run.spec

    # --- talking to generators -----------------------------------------------------------------

    def start_generators(self) -> None:
        """Wait for every generator, tell each where the run stands, start the publisher."""
        count = self.spec.generators.replicas
        self.channel.wait_for_generators(count, self.env.startup_timeout_s)
        self.pool = Pool.of(count)
        self.metrics.generators_desired.set(count)
        self.metrics.generators_ready.set(count)
        self.curriculum = NoPositiveResampling(
            self.spec.recipe.no_positive_resampling.pass_rate_threshold
        )
        if self.state.curriculum:
            self.curriculum.load_state_dict(self.state.curriculum)
        start = Start(
            version=self.state.version,
            step=self.state.step,
            curriculum=self.curriculum.state_dict(),
            consumed=self.state.consumed,
            members=self.pool.members,
        )
        self.tell(self.pool.members, start)  # one gone already is found as the group forms
        try:
            self.publisher.start(self.channel, count, gone=self.unreachable)
        except RanksMissing as err:
            # A generator that said hello and died before it joined (its pod failing as the gang
            # starts): the others train on and its replacement joins, as mid-run.
            missing = [r - 1 for r in err.missing or () if r >= 1]  # rank r: generator r - 1
            if not self.elastic or not self.pool.lose(missing, str(err), self.state.step):
                raise
            self.regroup()  # the group of the others, handed the current weights
        else:
            if self.state.version > 0:  # resumed: generators start from the base weights
                # Start-up, in the profile as on the compute clock: not the broadcast phase,
                # else the profile's training time (wall less start and evaluations) took it as
                # a step's.
                self.publish()
        self.broadcast_version = self.state.version
        self.report_pool()

    def receive(self, timeout_s: float) -> None:
        """Take one message: rollouts to the backlog, evaluations to results; failures raise."""
        got = self.channel.recv(timeout_s)
        if got is None:
            return
        generator, message = got
        if isinstance(message, RolloutGroup):
            self.hold(message)
        elif isinstance(message, EvalResult):
            self.results.append(message)
        elif isinstance(message, GeneratorStats):
            self.generator_stats[message.generator] = message
        elif isinstance(message, Failure):
            if not self.elastic:
                raise PeerError(f"generator {message.generator} failed: {message.message}")
            self.lose([message.generator], f"it failed: {message.message}")
        elif isinstance(message, Hello):
            self.welcome(generator)
        elif isinstance(message, Ready):
            self.admit(generator)

    def hold(self, group: RolloutGroup) -> None:
        """A group for a coming step; one the run consumed or holds already is dropped (a
        generator that died may have sent what its replacement then served again)."""
        self.pool.sent[group.generator] = time.monotonic()
        held = {(g.prompt_id, g.epoch) for g in self.backlog}
        if group.epoch in self.state.consumed.get(group.prompt_id, ()) or (
            (group.prompt_id, group.epoch) in held
        ):
            # Expected after the pool changed: what was in flight is served again (pool.py).
            log.info("prompt %s of epoch %d came twice; dropped", group.prompt_id, group.epoch)
            return
        # PipelineRL at work: samples whose tokens came from more than one policy version.
        mixed = sum(len(set(s.versions)) > 1 for s in group.samples)
        self.state.bump("mixed_version_samples", mixed)
        self.backlog.append(group)

    def take(self, groups: int) -> list[RolloutGroup]:
        with self.phases.timing("wait_rollouts"):
            self.wait_for_minimum()
            return self.collect(groups)

    def broadcast_weights(self) -> None:
        """Send the new policy; when it did not change, only ask for the next batch."""
        version = self.state.version
        if version == self.broadcast_version:
            self.channel.broadcast(MoreRollouts(version=version))
            return
        with self.phases.timing("broadcast"):
            try:
                self.publish()
                return
            except WeightSyncError as err:
                if not self.elastic:
                    raise
                why = str(err)
            # Out of the except clause: its traceback holds the broken group's last collective,
            # and with it the sockets a member still waiting on it would need closed to fail.
            self.lose(self.unreachable(), why)
            if self.broadcast_version != version:  # nobody was gone: try them all again
                self.regroup()

    def publish(self) -> None:
        """Send the policy as it is now, in whatever phase the caller is timing."""
        published = self.publisher.publish(self.policy, self.state.version)
        self.metrics.weight_sync_seconds.observe(published.seconds)
        self.sync_seconds = published.seconds
        self.metrics.weight_sync_bytes.set(published.bytes)
        self.broadcast_version = self.state.version

    # --- training --------------------------------------------------------------------------------

    def consume(self, groups: list[RolloutGroup]) -> None:
        """The groups a step takes are consumed, whether it trains on them or drops them: the
        data position and the curriculum move on (both are checkpointed together); what is still
        in flight or waiting is served again after a restart (scalerl.rollout.position)."""
        position = DataPosition(self.state.consumed)
        for group in groups:
            if not position.consume(group.prompt_id, group.epoch):
                log.warning("prompt %s of epoch %d taken twice", group.prompt_id, group.epoch)
        if self.spec.recipe.no_positive_resampling.enabled:
            for group in groups:
                self.curriculum.observe(group.prompt_id, group.pass_rate)
            self.metrics.curriculum_dropped_prompts.set(self.curriculum.dropped)
        if self.spec.data.log_consumed:
            taken = [
                {"id": g.prompt_id, "epoch": g.epoch, "generator": g.generator} for g in groups
            ]
            row = {"batch": self.state.batches, "step": self.state.step, "prompts": taken}
            RunFiles(self.env.run_dir).append_consumed(row)
        self.state.batches += 1

    def step_once(
        self, groups: list[RolloutGroup], max_off_policy: int | None
    ) -> StepResult | None:
        self.consume(groups)
        recipe = self.spec.recipe
        with self.phases.timing("build_batch"):
            batch, stats = build_batch(
                groups,
                current_version=self.state.version,
                max_off_policy=max_off_policy,
                pad_id=self.policy.pad_id,
                normalization=recipe.advantage_normalization,
                drop_zero_variance=recipe.zero_variance_filtering,
            )
        self.record_batch(stats)
        self.record_signal(stats)
        if batch is None:
            self.train = summarize(stats, None)
            return None
        self.ranks.announce("step", batch)
        with self.publisher.device():
            result = train_step(
                self.policy, self.optimizer, self.scheduler, batch, step_settings(self.spec)
            )
        self.phases.add("forward_backward", result.seconds - result.optimizer_seconds)
        self.phases.add("optimizer", result.optimizer_seconds)
        self.train = summarize(stats, result)
        if result.skipped:
            self.state.bump("skipped_steps")
            self.metrics.skipped_steps.inc()
            log.error("step %d skipped: %s (nothing was updated)", self.state.step, result.reason)
            return result
        self.state.step += 1
        self.state.version += 1
        self.stepped = (groups, stats, result)
        self.metrics.step_seconds.observe(result.seconds)
        self.metrics.trained_tokens.inc(result.tokens)
        self.metrics.entropy.set(result.entropy)
        self.metrics.grad_norm.set(result.grad_norm)
        self.metrics.importance_ratio_max.set(result.stats.get("ratio_max", 0.0))
        self.metrics.clip_fraction.set(result.stats.get("clip_fraction", 0.0))
        self.metrics.set_mismatch({lag: f.as_dict() for lag, f in result.mismatch.items()})
        return result

    def record_signal(self, stats: BatchStats) -> None:
        """Say at once when a step has nothing to learn from; fail the run when that lasts."""
        reason = self.no_signal = stats.no_signal
        if reason is None:
            if self.no_signal_streak:
                self.status.condition("LearningSignal", True, "GroupsKept", "groups kept")
            self.no_signal_streak = 0
            return
        self.no_signal_streak += 1
        self.state.bump("no_signal_steps")
        self.metrics.no_signal_steps.inc()
        log.warning("step %d: %s", self.state.step, reason)
        self.status.condition("LearningSignal", False, "AllGroupsFiltered", reason)
        limit = self.spec.failure_policy.no_signal_steps
        if self.no_signal_streak >= limit:
            message = f"{limit} steps in a row with no learning signal; last: {reason}"
            self.status.condition("Stopped", True, "NoLearningSignal", message)
            raise ScaleRLError(message)

    def record_batch(self, stats: BatchStats) -> None:
        self.state.bump("zero_variance_groups", stats.zero_variance_groups)
        self.state.bump("stale_groups", stats.stale_groups)
        # Samples whose reward function or rubric raised, trained on as failures (history's
        # counters; the generators' reward_errors counter has every one, evaluations' too).
        self.state.bump("reward_errors", stats.reward_errors)
        self.metrics.zero_variance_groups.inc(stats.zero_variance_groups)
        self.metrics.received_groups.inc(stats.received_groups)
        self.metrics.stale_groups.inc(stats.stale_groups)
        self.metrics.pass_rate.set(stats.pass_rate)
        if stats.mean_lag is not None:  # nothing trained: the last trained batch's lag stands
            self.metrics.policy_lag_steps.set(stats.mean_lag)

    def train_round(self) -> None:
        """PipelineRL: one step then a broadcast. PPO-off-policy-k: k steps on one policy's data."""
        recipe = self.spec.recipe
        if recipe.algorithm == "pipelinerl":
            self.step_once(self.take(recipe.batch.prompts), recipe.max_off_policy_steps)
        else:
            # k >= 1 (the spec refuses 0); the last round ends at budget.maxSteps.
            k = min(recipe.steps_per_round, self.spec.budget.max_steps - self.state.step)
            groups = self.take(k * recipe.batch.prompts)
            for i in range(k):
                chunk = groups[i * recipe.batch.prompts : (i + 1) * recipe.batch.prompts]
                self.step_once(chunk, max_off_policy=i)
                self.after_step()
        self.broadcast_weights()
        if recipe.algorithm == "pipelinerl":
            self.after_step()

    def after_step(self) -> None:
        self.state.compute_hours = self.clock.hours()
        self.metrics.step.set(self.state.step)
        self.metrics.policy_version.set(self.state.version)
        self.metrics.compute_hours.set(self.state.compute_hours)
        self.status.progress(self.progress())
        self.count_degraded()
        self.follow(self.status.desired_generators())
        self.track_step()
        steady, self.steady_seconds = self.steady_seconds, self.phases.steady()
        self.publisher.stepped(self.steady_seconds - steady)

    def track_step(self) -> None:
        """The step just taken, to the experiment trackers: once per step (a step that
        updated nothing is no step)."""
        if self.tracker is None or self.stepped is None or self.state.step <= self.tracked_step:
            return
        groups, stats, result = self.stepped
        samples = [s for g in groups for s in g.samples]
        metrics = tracked.step_metrics(
            self.train or TrainSummary(),
            reward=sum(s.reward for s in samples) / len(samples) if samples else None,
            lengths=[s.generated_tokens for s in samples],
            received_groups=stats.received_groups,
            kept_groups=stats.groups,
            stale_groups=stats.stale_groups,
            zero_variance_groups=stats.zero_variance_groups,
            tokens=result.tokens,
            lr=result.lr,
            step_seconds=result.seconds,
            sync_seconds=self.sync_seconds,
            compute=self.state.compute_hours,
            version=self.state.version,
        )
        self.tracker.step(self.state.step, metrics)
        self.tracked_step = self.state.step

    def progress(self) -> Progress:
        return Progress(
            step=self.state.step,
            version=self.state.version,
            compute=self.state.compute_hours,
            max_steps=self.spec.budget.max_steps,
            time=time.time(),
            train=self.train,
            eval_pass_rate=(self.state.evaluations or [{}])[-1].get("pass_rate"),
            no_signal=self.no_signal,
        )

    # --- evaluation and checkpoints ---------------------------------------------------------

    def evaluate(self) -> HistoryRow:
        """The held-out mean@k now, recorded with what each prompt scored. Evaluating is not
        training: the compute clock stands still meanwhile."""
        with self.clock.stopped(), self.phases.timing("evaluate"):
            results = self.ask_for_evaluation()
        scores = [score for r in results for score in r.scores]
        held_out = HeldOut.of(scores)
        row = HistoryRow.of(
            step=self.state.step,
            version=self.state.version,
            compute=self.clock.hours(),
            time=time.time(),
            held_out=held_out,
            train=self.train,
            counters=self.state.counters,
            trainer_seconds=self.phases.totals(),
            generation=self.generation_totals(),
        )
        completions = [c for r in results for c in r.completions]
        self.state.evaluations.append(row.to_dict())
        self.status.evaluation(row, scores, completions[: self.spec.evaluation.log_completions])
        self.metrics.eval_pass_rate.set(row.pass_rate)
        self.metrics.eval_pass_rate_stderr.set(row.pass_rate_se)
        excluded = row.fit_excluded is not None
        self.metrics.set_unscored(row.eval_unscored, row.eval_unscored_reasons, excluded)
        self.metrics.set_domain_pass_rates(row.pass_rate_by_domain)
        self.metrics.eval_compute_hours.set(row.compute)
        if self.tracker is not None:
            self.tracker.evaluation(row.step, tracked.eval_metrics(row.to_dict()))
        log.info(
            "evaluation at step %d: held-out pass rate %.3f ± %.3f (mean@%d, %d prompts)",
            row.step,
            row.pass_rate,
            row.pass_rate_se,
            self.spec.evaluation.generations_per_prompt,
            held_out.prompts,
        )
        if row.eval_unscored:
            log.warning(
                "evaluation at step %d: %d of %d samples could not be scored (%s), counted as "
                "not passed%s",
                row.step,
                row.eval_unscored,
                row.eval_samples,
                reasons_text(row.eval_unscored_reasons),
                f"; left out of the fit: {row.fit_excluded}" if excluded else "",
            )
        return row

    def ask_for_evaluation(self) -> list[EvalResult]:
        """Every generator's share of the held-out evaluation at this step, once each: a lost
        generator's share is asked of another member (evaluations sample alike in any process)."""
        step, count = self.state.step, self.pool.desired
        shards = set(range(count))
        asked: dict[int, tuple[int, int]] = {}  # shard: the member asked for it, its process
        heard = time.monotonic()
        while not shards <= (answered := {r.generator for r in self.results if r.step == step}):
            heard = self.pool.since_changed(heard)
            if (silent := time.monotonic() - heard) > self.waiting_s():
                raise PeerError(
                    f"evaluation at step {step}: generators {sorted(shards - answered)} did not "
                    f"answer within {silent:.0f} s"
                )
            members = self.pool.members
            for shard in sorted(shards - answered):
                # Asked again of a member when the one asked is gone, or was replaced under its
                # index since (the request went to the process that died).
                if members and asked.get(shard) not in self.pool.processes():
                    member = shard if shard in members else members[shard % len(members)]
                    asked[shard] = (member, self.pool.starts.get(member, 0))
                    command = Evaluate(step, self.state.version, shard=shard, shards=count)
                    self.tell([member], command)  # one gone is found by watch()
            before = len(self.results)
            self.receive(1.0)
            self.watch()
            if len(self.results) != before:
                heard = time.monotonic()
        # One result per shard (a generator lost after it answered has its share asked again).
        mine = {r.generator: r for r in self.results if r.step == step}
        self.results = [r for r in self.results if r.step != step]
        return [mine[shard] for shard in sorted(mine)]

    def generation_totals(self) -> dict[str, float]:
        """The generators' totals over the run: earlier attempts' (to their checkpoint) plus
        this attempt's, as of the generators' last report. Seconds are per generator."""
        totals = self.generation_spent
        stats = list(self.generator_stats.values())
        if not stats:
            return dict(totals)
        now = {
            "generation_seconds": sum(s.uptime_seconds for s in stats) / len(stats),
            **{
                f"generator_{name}_seconds": sum(getattr(s, f"{name}_seconds") for s in stats)
                / len(stats)
                for name in ("idle", "weight_sync", "score", "send_wait", "reward_wait")
            },
        }
        summed = dict(totals)
        for counts in (now, *(s.counts() for s in stats)):
            for name, value in counts.items():
                summed[name] = summed.get(name, 0.0) + value
        return summed

    def checkpoint(self) -> None:
        """Save, unless the last checkpoint holds this step and its evaluations already (the
        run's end right after a periodic checkpoint: a model's whole save again)."""
        now = (self.state.step, len(self.state.evaluations))
        if now == self.saved:
            return
        with self.phases.timing("checkpoint"):
            self.save()
        self.saved = now

    def save(self) -> None:
        self.state.compute_hours = self.clock.hours()
        self.state.trainer_seconds = self.phases.totals()
        self.state.generation = self.generation_totals()
        self.state.curriculum = self.curriculum.state_dict()
        saved = save_checkpoint(
            self.env.run_dir / "checkpoints",
            self.state.step,
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=self.state.to_dict(),
            keep=self.spec.checkpoint.keep,
            ranks=self.ranks,
        )
        log.info("saved %s (step %d)", saved, self.state.step)

    def done(self) -> bool:
        budget = self.spec.budget
        return self.state.step >= budget.max_steps or self.clock.hours() >= budget.max_compute_hours

    def run_to_end(self) -> None:
        """Train to the end of the run. A failure tells the generators to stop (so none waits
        out its peer timeout for a trainer that is gone) and propagates; the channel and the
        publisher are closed either way."""
        try:
            self._run_to_end()
        except ScaleRLError as err:
            self.channel.broadcast(Stop(reason=f"trainer failed: {err}"))
            raise
        except BaseException:
            self.channel.broadcast(Stop(reason="trainer failed"))
            raise
        finally:
            self.channel.close()
            self.publisher.close()
            if self.tracker is not None:
                self.tracker.close(finished=self.done())

    def _run_to_end(self) -> None:
        with self.phases.timing("start"):
            self.start_generators()
        if not self.state.evaluations:
            self.evaluate()  # R0: the pass rate at zero RL compute
        self.clock.start()
        every_eval, every_ckpt = self.spec.evaluation.every_steps, self.spec.checkpoint.every_steps
        while not self.done():
            before = self.state.step
            self.train_round()
            # A round (PPO-off-policy-k's k steps) evaluates once, on the weights it ends with,
            # if a multiple of everySteps fell in it: spec.evaluation_steps.
            after = self.state.step
            if after // every_eval > before // every_eval:
                self.evaluate()
            if after // every_ckpt > before // every_ckpt:
                self.checkpoint()
        if self.state.evaluations[-1]["step"] != self.state.step:
            self.evaluate()
        self.checkpoint()
        self.ranks.announce("stop")
        self.channel.broadcast(Stop(reason="run finished"))


def summarize(stats: BatchStats, result: StepResult | None) -> TrainSummary:
    """The last step as history and progress report it: its batch, and its update if any."""
    batch = TrainSummary(
        pass_rate=stats.pass_rate, truncation_rate=stats.truncation_rate, policy_lag=stats.mean_lag
    )
    if result is None or result.skipped:
        return batch
    return replace(
        batch,
        entropy=result.entropy,
        loss=result.loss,
        grad_norm=result.grad_norm,
        ratio_max=result.stats.get("ratio_max"),
        clip_fraction=result.stats.get("clip_fraction"),
        mismatch_by_lag={str(lag): f.as_dict() for lag, f in result.mismatch.items()},
    )


def step_settings(spec: RunSpec) -> StepSettings:
    """`train_step`'s settings from the recipe (every rank steps with the same); a loss without
    a cap or clip of its own gets the default, which it does not use."""
    recipe = spec.recipe
    return StepSettings(
        loss=recipe.loss.type,
        aggregation=recipe.aggregation,
        epsilon_max=getattr(recipe.loss, "epsilon_max", EPSILON_MAX),
        epsilon_low=getattr(recipe.loss, "epsilon_low", EPSILON_LOW),
        epsilon_high=getattr(recipe.loss, "epsilon_high", EPSILON_HIGH),
        max_grad_norm=recipe.optimizer.max_grad_norm,
        micro_batch_tokens=spec.trainers.micro_batch_tokens,
        packed=spec.trainers.pack_sequences,
        correction=Correction(**recipe.correction.model_dump()),
    )
