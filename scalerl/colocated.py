"""The colocated process (`scalerl colocated`, `spec.placement: colocated`): the trainer and one
vLLM engine in one process, sharing its device.

The trainer runs on the main thread exactly as in its own process (`scalerl.trainer.main`), and
the generator on a second thread with its asyncio loop (`scalerl.generator.main`), its engine in
this process (`scalerl.generator.inproc`). What changes is only how they meet:

- the rollout stream is a pair of queues (`scalerl.rollout.pipe`): rollout groups reach the
  trainer as the objects the generator built;
- new weights are the policy's own tensors, loaded by the engine in memory: no broadcast, no
  buckets, no checksums (`InMemoryPublisher`, the trainer's `WeightPublisher` here);
- on a GPU the engine steps only while the trainer does not (`scalerl.generator.colocation`),
  and sleeps (its weights and KV cache released) while the trainer steps; on a CPU the engine
  samples on one core while the trainer steps on the others, or they take turns with every
  core for the trainer, whichever the first steps measure to be faster. Weight loads always
  come between engine steps.

The recipe is unchanged. PipelineRL-k: the engine samples the next batch while (CPU) or between
(GPU) steps, sequences in flight at a weight load continue on the new weights, and groups more
than k versions old are dropped. PPO-off-policy-k: k batches from one policy, k steps, one load.
A process killed by a signal takes its engine with it: there is no engine process to orphan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
import traceback
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scalerl.environment import ProcessEnv, configure_logging
from scalerl.errors import ScaleRLError, WeightSyncError
from scalerl.generator.colocation import Colocation, CoreShare
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout.pipe import GENERATOR, GeneratorEnd, TrainerEnd, pipe
from scalerl.rollout.records import Failure, MoreRollouts
from scalerl.spec import ScaleRLRun, load_run
from scalerl.trainer.main import build_trainer
from scalerl.trainer.publish import Published, tensor_bytes
from scalerl.trainer.shard import Ranks, full_weights

if TYPE_CHECKING:
    from scalerl.rollout.stream import TrainerChannel
    from scalerl.sync.group import Gone
    from scalerl.trainer.policy import Policy

log = logging.getLogger("scalerl.colocated")
# After the trainer stops, how long the engine thread has to shut its engine down.
ENGINE_STOP_S = 30.0


def main() -> None:
    env = ProcessEnv.from_environ()
    configure_logging()
    run = load_run(env.spec)
    run_colocated(run, env)


def run_colocated(run: ScaleRLRun, env: ProcessEnv) -> None:
    """Train to the end of the run with the engine on a second thread; raises what failed."""
    colocation = colocation_here()
    trainer_end, generator_end = pipe()
    publisher = InMemoryPublisher(colocation, env.startup_timeout_s)
    trainer = build_trainer(run, env, Ranks(), channel=trainer_end, publisher=publisher)
    # One /metrics for the process: the generator's series join the trainer's registry.
    metrics = GeneratorMetrics(run.namespace, run.name, alongside=trainer.metrics)
    engine = threading.Thread(
        target=_engine_thread,
        args=(run, env, generator_end, metrics, colocation),
        name="scalerl-engine",
        daemon=True,  # a wedged engine must not keep a failed process alive
    )
    engine.start()
    try:
        trainer.run_to_end()  # a failure tells the engine thread to stop, then propagates
    finally:
        engine.join(ENGINE_STOP_S)


@dataclass
class InMemoryPublisher:
    """The trainer's `WeightPublisher` here: each version's tensors loaded into the engine by
    reference, between two of its steps (no copy on our side, no checksums: nothing crosses a
    wire), then the generator told to sample on. A training step takes the device from the
    engine as `colocation` says."""

    colocation: Colocation
    timeout_s: float  # a resumed run's first load may wait this long for the engine to start
    channel: TrainerChannel | TrainerEnd | None = None

    def start(
        self,
        channel: TrainerChannel | TrainerEnd,
        generators: int,
        gone: Gone | None = None,
    ) -> None:
        self.channel = channel

    def publish(self, policy: Policy, version: int) -> Published:
        if self.channel is None:
            raise WeightSyncError(f"version {version} published before the engine said hello")
        if policy.adapter is not None:  # LoRA: only the adapter, as a folder in memory
            # Gathered whole (a GPU's one rank is sharded too), in float32 as checkpoints are.
            adapter = dict(full_weights(policy, cast=False))
            save = functools.partial(policy.save_adapter, weights=adapter)
            seconds = self.colocation.load_adapter(save, version, self.timeout_s)
            return self._announce(version, Published(seconds, tensor_bytes(adapter.items())))
        weights = list(policy.named_weights())
        seconds = self.colocation.load(weights, version, self.timeout_s)
        return self._announce(version, Published(seconds, tensor_bytes(weights)))

    def regroup(
        self,
        generation: int,
        members: list[int],
        join_timeout_s: float,
        gone: Gone | None = None,
    ) -> None:
        raise WeightSyncError("a colocated run's one generator lives in the trainer's process")

    def _announce(self, version: int, published: Published) -> Published:
        assert self.channel is not None
        self.channel.broadcast(MoreRollouts(version=version))
        return published

    def device(self) -> AbstractContextManager[None]:
        return self.colocation.train()

    def stepped(self, seconds: float) -> None:
        self.colocation.stepped(seconds)

    def close(self) -> None:
        pass  # the engine goes with its thread


def colocation_here() -> Colocation:
    """How trainer and engine share this machine (call on the trainer's thread). A GPU: in
    turns, the engine asleep while the trainer steps. A CPU with several cores: at once (the
    engine on one core, the trainer on the others) or in turns, whichever the run measures to
    be faster (`CoreShare`)."""
    if torch.cuda.is_available():
        return Colocation(sleep=True, exclusive=True)
    cores = os.cpu_count() or 1
    if cores < 2:
        return Colocation(exclusive=True)
    return Colocation(share=CoreShare(cores))


def _engine_thread(
    run: ScaleRLRun,
    env: ProcessEnv,
    channel: GeneratorEnd,
    metrics: GeneratorMetrics,
    colocation: Colocation,
) -> None:
    """The generator, on its own loop. Whatever ends it unexpectedly reaches the trainer as a
    Failure, so the trainer never waits out its peer timeout for a dead thread."""
    from scalerl.generator.main import build_generator, run_generator

    env = dataclasses.replace(env, generator_index=GENERATOR, metrics_port=0)
    built = False
    try:
        generator = build_generator(run, env, channel, metrics, colocation)
        built = True
        asyncio.run(run_generator(generator))
    except ScaleRLError as err:
        if not built:  # bad data or environment: run_generator never ran to tell the trainer
            channel.try_send(Failure(GENERATOR, str(err)))
    except BaseException as err:  # a bug: the trainer must hear of it
        log.error("engine thread failed:\n%s", traceback.format_exc())
        channel.try_send(Failure(GENERATOR, f"engine thread failed: {type(err).__name__}: {err}"))
