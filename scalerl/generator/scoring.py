"""Scoring a group's completions without stalling the engine: `Scorer.score` awaits the rewards
of many answers at once.

String rewards (exact, math, a user's module:function) are cheap and score inline, on the event
loop's thread (math's timeouts need the main thread). `code` runs programs: those go to a pool of
threads sized to the CPUs this process may use (`os.sched_getaffinity`, capped by the container's
cgroup CPU limit; spec.data.code.workers overrides), each thread waiting on its sandboxed
process, so while tests run the event loop — and with it the engine — keeps generating. A
completion whose sandbox failed comes back as None: the caller drops it from training and it is
counted (in an evaluation it is unscored and counts as not passed).

A reward function that raises (a user's module:function) scores its completion as failed: -1,
with the error (`Reward.error`), counted in reward_errors. It never passes, so a policy gains
nothing by making its reward raise; and the run goes on instead of losing its generator.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl.errors import InputError, ScaleRLError
from scalerl.generator.code_reward import NOT_RUN, TIMEOUT, score_code
from scalerl.generator.rewards import INCORRECT, RewardFn, load_reward
from scalerl.metrics import GeneratorMetrics
from scalerl.sandbox import PerThread, isolation
from scalerl.spec import CodeSpec

if TYPE_CHECKING:
    from scalerl.generator.prompts import Example

log = logging.getLogger(__name__)


# Where the kernel says how much CPU time the container may use (cgroup v2, then v1): in a pod with
# a CPU limit, that — not the node's cores its affinity lists — is how many programs can run.
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


def pool_size(spec: CodeSpec) -> int:
    """Programs run at once: spec.data.code.workers, or one per CPU this process may use (its
    CPU affinity, capped by its cgroup's CPU limit rounded up)."""
    if spec.workers:
        return spec.workers
    cpus = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit()
    return cpus if limit is None else max(1, min(cpus, math.ceil(limit)))


def cgroup_cpu_limit() -> float | None:
    """The container's CPU limit in CPUs (quota / period), None when it has none or says none."""
    try:
        quota, period = CGROUP_V2_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (CGROUP_V1_CPU / "cpu.cfs_quota_us").read_text().strip()
            period = (CGROUP_V1_CPU / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return int(quota) / int(period) if int(quota) > 0 and int(period) > 0 else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Reward:
    """One completion's reward: `value` None when the code sandbox failed (nothing was learnt
    of the program); `error` set when the reward function raised (`value` is then INCORRECT)."""

    value: float | None
    error: str = ""


class Scorer:
    """The run's rewards, applied to (answer, reference) pairs; code in a pool of threads.

    A run whose rows name their rewards (spec.data.train as sources, or a row's `reward` field)
    scores each group by its row's reward: `rewards` names every one the rows use, the first
    being the one `score` applies when it is given none."""

    def __init__(
        self,
        rewards: str | Sequence[str],
        code: CodeSpec | None = None,
        metrics: GeneratorMetrics | None = None,
    ) -> None:
        names = [rewards] if isinstance(rewards, str) else list(dict.fromkeys(rewards))
        self.code_spec = code or CodeSpec()
        self.metrics = metrics
        self.default = names[0]
        self.rewards: dict[str, RewardFn] = {n: load_reward(n, self.code_spec) for n in names}
        self.is_code = "code" in self.rewards
        self.reward: RewardFn = self.rewards[self.default]
        self.pool = (
            ThreadPoolExecutor(pool_size(self.code_spec), thread_name_prefix="code-reward")
            if self.is_code
            else None
        )
        # One sandbox per pool thread, kept for the run: a program then starts in a forked
        # child, not in a new bubblewrap and interpreter (bench/code_bench.py: ~12x the tests/s).
        # Refused here, at the generator's start, where no sandbox can be made and the spec does
        # not allow plain processes by name (SandboxUnavailable).
        mode = isolation.required(self.code_spec.unsafe_allow_plain) if self.is_code else None
        if mode is not None:  # the pod's log says which sandbox its programs get
            log.info("code sandbox: %s", mode.describe())
        self.sandboxes = PerThread(mode)

    async def score(
        self, pairs: list[tuple[str, str]], reward: str | None = None
    ) -> list[float | None]:
        """The reward of each (answer, reference) by `reward` (a name given at construction;
        None: the first); None where the sandbox failed (see `score_all`)."""
        return [r.value for r in await self.score_all(pairs, reward)]

    async def score_all(
        self, pairs: list[tuple[str, str]], reward: str | None = None
    ) -> list[Reward]:
        """The reward of each (answer, reference) by `reward` (a name given at construction;
        None: the first), with why where there is none or the reward function raised."""
        name = self.default if reward is None else reward
        if name not in self.rewards:
            raise InputError(f"reward {name!r} was not loaded by this scorer ({self.default!r})")
        if name != "code" or self.pool is None:
            score = self.rewards[name]
            return [self.score_answer(score, name, a, r) for a, r in pairs]
        loop = asyncio.get_running_loop()
        jobs = [loop.run_in_executor(self.pool, self.score_program, a, r) for a, r in pairs]
        return [Reward(value) for value in await asyncio.gather(*jobs)]

    def score_answer(self, score: RewardFn, name: str, answer: str, reference: str) -> Reward:
        """One answer by a string reward; one that raises scores it as failed, counted."""
        try:
            return Reward(float(score(answer, reference)))
        except ScaleRLError:  # ours: the data's fault (a bad reference), said as it is
            raise
        except Exception as err:  # noqa: BLE001 — a user's reward: any error is counted, not fatal
            error = f"{type(err).__name__}: {err}"
            log.warning("reward %s raised; scored as failed: %s", name, error)
            if self.metrics is not None:
                self.metrics.reward_errors.inc()
            return Reward(INCORRECT, error)

    def score_program(self, answer: str, reference: str) -> float | None:
        """One completion's program against its tests (in a pool thread), counted."""
        verdict = score_code(
            answer, reference, self.code_spec, stop_early=True, sandbox=self.sandboxes.get()
        )
        if self.metrics is not None:
            self.metrics.code_execution_seconds.observe(verdict.seconds)
            self.metrics.code_tests.inc(sum(t.verdict != NOT_RUN for t in verdict.tests))
            self.metrics.code_test_timeouts.inc(sum(t.verdict == TIMEOUT for t in verdict.tests))
        if verdict.error:
            log.warning("code sandbox failed; sample dropped: %s", verdict.error)
            if self.metrics is not None:
                self.metrics.sandbox_failures.inc()
            return None
        return verdict.reward

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.sandboxes.close()


def rewards_of(default: str, examples: list[Example]) -> list[str]:
    """The rewards `examples` are scored by, the run's `default` first (a scorer's fallback)."""
    return list(dict.fromkeys([default, *(e.reward for e in examples if e.reward)]))
