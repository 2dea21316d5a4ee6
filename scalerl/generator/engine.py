"""The generation engine: vLLM's `AsyncLLM` driven for RL rollouts with in-flight weight updates.

One engine per generator process. It samples completions under the ScaleRL length rules
(`scalerl.generator.length`), records the generator's per-token log-probs (after temperature and
the sampling filters) and the policy version of every token, and swaps weights between decode
steps (PipelineRL): generation pauses with its requests and KV cache kept, the worker extension
(`scalerl.generator.worker`) receives a whole version over the sync group and reloads it in place,
and the same requests continue on the new weights.

Version stamping. vLLM labels every engine step's output with the engine's current "weight
version" and reports, per completion, the spans of output tokens each label produced. The label is
changed only while the scheduler is paused, right after the reload succeeded, so each token
carries exactly the version of the weights whose forward pass sampled it: no token sampled before
the swap can carry the new version and none after it the old one, whatever the timing of output
processing. Tokens the engine did not sample (the interruption phrase) carry `engine.version` at
the moment they are injected. Sampling therefore uses FINAL_ONLY outputs: streaming deltas would
add per-token work on the event loop and nothing to the stamps' accuracy.

Stale KV. As in PipelineRL, a sequence running across a swap keeps the KV its earlier tokens
got from the old weights. vLLM's prefix cache would also hand old-weight KV to requests started
after the swap (a prompt or a shared template prefix seen before), for as long as the blocks stay
cached. Every request is therefore salted with the policy version its sample started on
(`cache_salt`): both phases of one sample share their blocks, as one long request would, and a
sample started after a swap never reads KV computed by weights older than its start.

vLLM is imported only inside methods, after `prepare_vllm_environment` set what it reads at import.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import random
import shutil
import time
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from scalerl.errors import DataError, InputError, PeerError, WeightSyncError
from scalerl.generator import adapters
from scalerl.generator.colocation import Colocation, Turnstile

# EngineConfig and prepare_vllm_environment are named from here by the engine's callers.
from scalerl.generator.engine_config import EngineConfig as EngineConfig
from scalerl.generator.engine_config import cpu_kv_cache_bytes, whole_prefills
from scalerl.generator.engine_config import prepare_vllm_environment as prepare_vllm_environment
from scalerl.generator.inproc import InprocLLM
from scalerl.generator.length import Allowance, LengthControl, Sampler, Segment
from scalerl.generator.tokens import eos_ids, think_end_id
from scalerl.rollout.records import Sample
from scalerl.spec import INTERRUPTION_PHRASE

if TYPE_CHECKING:
    from torch import Tensor
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput
    from vllm.v1.engine.async_llm import AsyncLLM

T = TypeVar("T")
WORKER_EXTENSION = "scalerl.generator.worker.WeightSyncExtension"
DEFAULT_PHRASE = INTERRUPTION_PHRASE
# Pause, resume and version labels are quick engine-core calls; this only catches a wedged engine.
CONTROL_TIMEOUT_S = 30.0
# Beyond the worker's own receive timeout: RPC round trip plus the in-place reload.
RPC_GRACE_S = 30.0
SHUTDOWN_TIMEOUT_S = 5.0


class GenerationEngine:
    """Drives one `AsyncLLM`; `version` is the policy version of the weights it holds.

    With `colocation` (the colocated mode) the engine runs in this process instead
    (`scalerl.generator.inproc`): it shares the device with the trainer through the colocation's
    turnstile (`scalerl.generator.colocation`), and the trainer loads new weights into it in
    memory (`load_in_memory`) instead of broadcasting them over the sync group.
    """

    def __init__(
        self, config: EngineConfig, *, version: int = 0, colocation: Colocation | None = None
    ) -> None:
        self.config = config
        self.version = version
        self.colocation = colocation
        self._llm: AsyncLLM | InprocLLM | None = None
        self._length: LengthControl | None = None
        self._rng = random.Random(config.seed)
        self._request_ids = itertools.count()
        self._update_lock = asyncio.Lock()
        # With LoRA: the adapter every request names (None until the first version arrives: a
        # fresh adapter is the base), and where version folders are written.
        self._adapter: LoRARequest | None = None
        self._scratch: Path | None = None

    # --- life cycle ----------------------------------------------------------------------------

    async def start(self) -> float:
        """Start vLLM (seconds: ~3-20 on CPU, longer for big models); returns the time taken."""
        if self._llm is not None:
            return 0.0
        if not (Path(self.config.model_path) / "config.json").is_file():
            raise DataError(f"{self.config.model_path}: not a Hugging Face model directory")
        prepare_vllm_environment(self.config)
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        if self.colocation is not None:
            turnstile = self.colocation.turnstile
            self._llm = InprocLLM.from_engine_args(self._engine_args(), turnstile)
        elif self._separate_process():
            self._llm = AsyncLLM.from_engine_args(self._engine_args())
        else:
            self._llm = InprocLLM.from_engine_args(self._engine_args(), Turnstile())
        try:
            await self._control(self._llm.update_weight_version(str(self.version)), "labelling")
            self._length = self._length_control(self._llm.get_tokenizer())
        except BaseException:
            await self.shutdown()
            raise
        if self.colocation is not None:
            self.colocation.ready(self)
        return time.monotonic() - started

    def _separate_process(self) -> bool:
        if self.config.separate_process is not None:
            return self.config.separate_process
        return not self._on_cpu()

    @staticmethod
    def _on_cpu() -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    def _engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

        config = self.config
        colocation = self.colocation
        separate = colocation is None and self._separate_process()
        return (AsyncEngineArgs if separate else EngineArgs)(
            model=str(config.model_path),
            dtype=config.dtype,
            seed=config.seed,
            max_model_len=config.max_model_len,
            enforce_eager=True,
            worker_extension_cls=WORKER_EXTENSION,
            # Log-probs of the distribution actually sampled from (after temperature and the
            # filters), which is what the importance ratio's denominator must be; the trainer
            # computes the same distribution (scalerl.recipe.sampling).
            logprobs_mode="processed_logprobs",
            hf_overrides={"head_dtype": "float32"} if config.fp32_lm_head else {},
            disable_log_stats=True,
            kv_cache_memory_bytes=cpu_kv_cache_bytes(config) if self._on_cpu() else None,
            # Colocated on a GPU: the engine's memory is released while the trainer steps.
            enable_sleep_mode=colocation is not None and colocation.sleep,
            **whole_prefills(config),
            **adapters.engine_args(config.lora),
        )

    def _length_control(self, tokenizer: Any) -> LengthControl:
        config = self.config
        phrase = tokenizer.encode(config.phrase, add_special_tokens=False)
        return LengthControl(
            config.plan,
            think_end_id(tokenizer, config.think_end),
            tuple(phrase),
            config.max_model_len,
            tuple(sorted(eos_ids(config.model_path, tokenizer))),
        )

    async def shutdown(self, *, exiting: bool = False) -> None:
        """Leave the sync group and stop vLLM; safe to call twice. `exiting`: the process ends
        next, so an in-process engine's memory is left to the OS (a separate engine process is
        stopped either way)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        if self.colocation is None:  # only a broadcast receiver joined a sync group
            try:
                if isinstance(llm, InprocLLM):
                    llm.engine.collective_rpc("close_weight_sync")
                else:
                    rpc = llm.collective_rpc("close_weight_sync")
                    await self._control(rpc, "closing the sync group", SHUTDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 — the engine is going away regardless
                pass
        if isinstance(llm, InprocLLM):
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S, release=not exiting)
        else:
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # --- sampling ------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        n: int,
        *,
        max_tokens: int | None = None,
        seed: str | None = None,
    ) -> list[Sample]:
        """Sample `n` completions of `prompt_ids` (reward left 0.0 for the caller to score).

        With `max_tokens` None the ScaleRL length rules apply (thinking budget, forced
        interruption, answer budget; see `scalerl.generator.length`). With an int, each sample
        is one plain request of at most `max_tokens` tokens.

        With `seed`, the samples are a function of the seed, the prompt and the weights alone:
        the cutoffs are drawn from the seed, and every request samples from a generator of its
        own seeded from it, so neither what the engine sampled before nor what shares its batches
        moves them (the held-out evaluation is the same after a restart).
        """
        length = self._ready()[1]
        if n < 1:
            raise InputError(f"n must be >= 1 samples; got {n}")
        if max_tokens is not None and max_tokens < 1:
            raise InputError(f"max_tokens must be >= 1; got {max_tokens}")
        prompt = list(prompt_ids)
        samplers = [self._sampler(None if seed is None else f"{seed}/{j}") for j in range(n)]
        if max_tokens is None:
            rng = self._rng if seed is None else random.Random(f"{seed}/cutoffs")
            cutoffs = [self.config.plan.cutoff(rng) for _ in range(n)]
            jobs = [
                length.sample(sampler, prompt, c, self._current)
                for sampler, c in zip(samplers, cutoffs, strict=True)
            ]
        else:
            jobs = [length.sample_plain(sampler, prompt, max_tokens) for sampler in samplers]
        return await _all(jobs)

    async def turn(
        self, prompt_ids: list[int], allowance: Allowance, seed: str | None = None
    ) -> Sample:
        """One model turn of a conversation under the length rules, within what its rollout
        has left (`Allowance`: scalerl.generator.length); `seed` as in `generate`."""
        length = self._ready()[1]
        return await length.sample(
            self._sampler(seed),
            list(prompt_ids),
            allowance.thinking,
            self._current,
            answer_budget=allowance.answer,
        )

    async def evaluate(
        self, prompts: list[list[int]], n: int, seeds: Sequence[str] | None = None
    ) -> list[list[Sample]]:
        """`n` samples of every prompt under the same length rules, all prompts concurrently
        (`seeds`: one per prompt, as `generate` takes it)."""
        if seeds is not None and len(seeds) != len(prompts):
            raise InputError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        chosen = seeds if seeds is not None else [None] * len(prompts)
        return await _all(
            [self.generate(p, n, seed=s) for p, s in zip(prompts, chosen, strict=True)]
        )

    def _sampler(self, seed: str | None) -> Sampler:
        """The requests of one sample: all on the KV cache of the weights it started on (module
        doc); with `seed`, request i of the sample samples with the seed `seed`/i."""
        salt = _cache_salt(self.version)
        if seed is None:
            return functools.partial(self.sample_segment, cache_salt=salt)
        requests = itertools.count()

        def seeded(prompt: list[int], max_tokens: int, stops: Sequence[int]) -> Awaitable[Segment]:
            request_seed = _request_seed(f"{seed}/{next(requests)}")
            return self.sample_segment(
                prompt, max_tokens, stops, cache_salt=salt, seed=request_seed
            )

        return seeded

    async def sample_segment(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        stop_token_ids: Sequence[int] = (),
        *,
        cache_salt: str | None = None,
        seed: int | None = None,
    ) -> Segment:
        """One request with one completion: the primitive the length rules are built from.

        Requests share cached KV blocks only with requests of the same `cache_salt` (default:
        the current policy version's), so none reuses KV computed by older weights. `seed`: the
        request samples from a generator of its own (vLLM's per-request seed).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        llm = self._ready()[0]
        params = SamplingParams(
            n=1,
            temperature=self.config.temperature,
            # The same filters for training rollouts and evaluations (both are sampled here).
            top_p=self.config.filters.top_p,
            top_k=self.config.filters.top_k,
            min_p=self.config.filters.min_p,
            max_tokens=max_tokens,
            stop_token_ids=list(stop_token_ids),
            logprobs=0,  # the sampled token's log-prob only
            flat_logprobs=True,  # a few lists per request instead of a dict per token
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            seed=seed,
        )
        request_id = f"scalerl-{next(self._request_ids)}"
        final = None
        salt = cache_salt or _cache_salt(self.version)
        prompt = TokensPrompt(prompt_token_ids=prompt_ids, cache_salt=salt)
        async for output in llm.generate(prompt, params, request_id, lora_request=self._adapter):
            final = output
        if final is None or not final.outputs or final.outputs[0].finish_reason == "abort":
            raise PeerError(f"vLLM aborted request {request_id} (engine shutting down?)")
        return _segment(final.outputs[0], request_id)

    def pending_requests(self) -> int:
        """Engine requests submitted and not finished (one per sample and phase)."""
        return self._ready()[0].get_num_unfinished_requests()

    def _current(self) -> int:
        return self.version

    # --- weights -------------------------------------------------------------------------------

    async def init_weight_sync(
        self,
        host: str,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float,
        join_timeout_s: float | None = None,
        keys_dir: str | None = None,
        generation: int = 0,
    ) -> None:
        """Join `generation` of the trainer's weight-sync group as receiver `rank` (call again
        to join a later one); `join_timeout_s` bounds the wait for the other ranks (default
        `timeout_s`), `keys_dir` holds the run's keys (its sync store admits no one else)."""
        llm = self._receiver()
        where = f"the weight-sync group at {host}:{port} as rank {rank} of {world_size}"
        joining_s = timeout_s if join_timeout_s is None else join_timeout_s
        async with self._update_lock:
            args = (host, port, world_size, rank, timeout_s, joining_s, keys_dir, generation)
            if isinstance(llm, InprocLLM):
                join = functools.partial(llm.engine.collective_rpc, "init_weight_sync", args=args)
                rpc = llm.while_held(join)
            else:
                rpc = llm.collective_rpc("init_weight_sync", args=args)
            try:
                await asyncio.wait_for(rpc, joining_s + RPC_GRACE_S)
            except TimeoutError:
                raise WeightSyncError(f"joining {where} took over {joining_s:g} s") from None
            except Exception as err:  # vLLM re-raises a worker error as a plain Exception
                raise WeightSyncError(f"joining {where} failed: {_worker_message(err)}") from err

    async def update_weights(self, version: int, timeout_s: float) -> float:
        """Swap to policy `version` in flight; returns the seconds generation was paused.

        In-flight requests are frozen with their KV cache, the worker receives the whole version
        and reloads it in place, then they continue on the new weights. `version` is bumped only
        if the swap succeeded. On failure generation resumes on the old weights and this raises
        WeightSyncError (the sync group may then need `init_weight_sync` again).
        """
        llm = self._receiver()
        async with self._update_lock:
            started = time.monotonic()
            if isinstance(llm, InprocLLM):  # paused by the turnstile while the worker receives
                await llm.while_held(functools.partial(self._swap_held, llm, version, timeout_s))
                return time.monotonic() - started
            try:
                await self._control(_pause(llm), "pausing")
                await self._swap(llm, version, timeout_s)
            finally:
                # If the worker is still inside a timed-out receive, the engine core answers the
                # resume only when it returns; the receive is bounded by `timeout_s` itself.
                await self._control(llm.resume_generation(), "resuming", timeout_s + RPC_GRACE_S)
            return time.monotonic() - started

    async def _swap(self, llm: AsyncLLM, version: int, timeout_s: float) -> None:
        keep = f"generation continues on version {self.version}"
        method, args, folder = self._receive_call(version, timeout_s)
        rpc = llm.collective_rpc(method, args=args)
        try:
            applied = await asyncio.wait_for(rpc, timeout_s + RPC_GRACE_S)
        except TimeoutError:
            raise WeightSyncError(
                f"weights of version {version} did not arrive within {timeout_s:g} s; {keep}"
            ) from None
        except Exception as err:  # vLLM re-raises a worker error as a plain Exception
            raise WeightSyncError(
                f"receiving weights of version {version} failed: {_worker_message(err)}; {keep}"
            ) from err
        _check_applied(applied, version)
        if folder is not None:
            await self._control(llm.add_lora(adapters.adapter_request(folder, reload=True)),
                                "loading the adapter")  # fmt: skip
            self._use_adapter(folder)
        # Still paused: every token sampled from here on carries the new label (module doc).
        await self._control(llm.update_weight_version(str(version)), "labelling weights")
        self.version = version

    def _receive_call(
        self, version: int, timeout_s: float
    ) -> tuple[str, tuple[Any, ...], Path | None]:
        """The worker method that receives `version`, its arguments, and (LoRA) the adapter
        folder it writes."""
        lora = self.config.lora
        if lora is None:
            return "receive_weights", (timeout_s, version), None
        folder = self.adapter_folder(version)
        shape = (lora.rank, lora.alpha, lora.dropout, self.config.model_path)
        return "receive_adapter", (timeout_s, version, str(folder), *shape), folder

    def _swap_held(self, llm: InprocLLM, version: int, timeout_s: float) -> None:
        """`_swap` for an engine in this process, in a thread holding its turnstile: the worker
        receives the version, and the adapter and the label change before any step runs."""
        keep = f"generation continues on version {self.version}"
        method, args, folder = self._receive_call(version, timeout_s)
        try:
            applied = llm.engine.collective_rpc(method, args=args)
            if folder is not None:
                llm.engine.add_lora(adapters.adapter_request(folder, reload=True))
        except Exception as err:
            raise WeightSyncError(
                f"receiving weights of version {version} failed: {_worker_message(err)}; {keep}"
            ) from err
        _check_applied(applied, version)
        if folder is not None:
            self._use_adapter(folder)
        llm.engine.set_weight_version(str(version))
        self.version = version

    def load_in_memory(self, weights: Iterable[tuple[str, Tensor]], version: int) -> float:
        """Colocated, from the trainer's thread while it holds the device (no engine step runs):
        load `weights` as `version` and label it; returns the seconds taken. Tokens sampled
        from here on are the new version's, as after a pause (module doc)."""
        llm = self._ready()[0]
        assert isinstance(llm, InprocLLM), "only an in-process engine loads weights in memory"
        started = time.monotonic()
        try:
            llm.engine.collective_rpc("load_weights_in_memory", args=(weights,))
        except Exception as err:
            raise WeightSyncError(
                f"loading weights of version {version} in memory failed: {_worker_message(err)}"
            ) from err
        llm.engine.set_weight_version(str(version))
        self.version = version
        return time.monotonic() - started

    def load_adapter(self, folder: Path, version: int) -> float:
        """Colocated with LoRA, like `load_in_memory`: load the adapter folder `folder` (the
        trainer's, written in memory) into the adapter slot as `version`."""
        llm = self._ready()[0]
        assert isinstance(llm, InprocLLM), "only an in-process engine loads adapters in memory"
        started = time.monotonic()
        try:
            llm.engine.add_lora(adapters.adapter_request(folder, reload=True))
        except Exception as err:
            raise WeightSyncError(
                f"loading the adapter of version {version} failed: {_worker_message(err)}"
            ) from err
        self._use_adapter(folder)
        llm.engine.set_weight_version(str(version))
        self.version = version
        return time.monotonic() - started

    def adapter_folder(self, version: int) -> Path:
        """Where version `version`'s adapter folder goes (LoRA)."""
        if self._scratch is None:
            self._scratch = adapters.scratch_directory()
        return adapters.version_folder(self._scratch, version)

    def _use_adapter(self, folder: Path) -> None:
        """Requests from now on name the adapter loaded from `folder`; older folders go."""
        self._adapter = adapters.adapter_request(folder)
        if self._scratch is not None:
            adapters.prune(self._scratch)

    # --- helpers -------------------------------------------------------------------------------

    def _ready(self) -> tuple[AsyncLLM | InprocLLM, LengthControl]:
        if self._llm is None or self._length is None:
            raise PeerError("the generation engine is not running: call start() first")
        return self._llm, self._length

    def _receiver(self) -> AsyncLLM | InprocLLM:
        """The engine as a receiver of broadcast weights (a colocated one is not)."""
        llm = self._ready()[0]
        if self.colocation is not None:
            raise WeightSyncError("a colocated engine takes weights in memory: load_in_memory")
        return llm

    async def _control(
        self, call: Awaitable[T], what: str, timeout_s: float = CONTROL_TIMEOUT_S
    ) -> T:
        try:
            return await asyncio.wait_for(call, timeout_s)
        except TimeoutError:
            raise WeightSyncError(
                f"vLLM engine did not finish {what} within {timeout_s:g} s"
            ) from None
        except Exception as err:
            raise PeerError(f"vLLM engine failed {what}: {_worker_message(err)}") from err


def _check_applied(applied: Sequence[int], version: int) -> None:
    if list(applied) != [version] * len(applied):
        raise WeightSyncError(f"workers applied versions {applied}, expected {version}")


async def _pause(llm: AsyncLLM) -> None:
    """Freeze in-flight requests with their KV cache: `AsyncLLM.pause_generation(mode="keep",
    clear_cache=False)` without its closing 20 ms sleep, which vLLM keeps only so that outputs
    already on their way arrive before it returns, "not required for correctness". Ours do not
    depend on that order: the engine labels each token's version (module doc). 20 ms is about
    40 % of an idle engine's whole update (bench/update_bench.py)."""
    await llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)


def _segment(completion: CompletionOutput, request_id: str) -> Segment:
    """Per-token ids, log-probs and versions of one finished completion."""
    ids = list(completion.token_ids)
    positions = completion.logprobs
    if positions is None:
        raise PeerError(f"vLLM returned no log-probs for request {request_id}")
    flat = getattr(positions, "logprobs", None)  # FlatLogprobs keeps one list for all positions
    if isinstance(flat, list) and len(flat) == len(ids):  # logprobs=0: the sampled token only
        logprobs = list(flat)
    else:
        logprobs = [positions[i][token].logprob for i, token in enumerate(ids)]
    versions: list[int] = []
    for span in completion.weight_versions or ():
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != len(ids):
        raise PeerError(f"vLLM labelled {len(versions)} of {len(ids)} tokens of {request_id}")
    return Segment(ids, logprobs, versions, str(completion.finish_reason))


def _request_seed(key: str) -> int:
    """A request's sampling seed from a key, the same in every process (not `hash`, which is
    salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) >> 1


def _cache_salt(version: int) -> str:
    return f"scalerl-policy-{version}"


def _worker_message(err: BaseException) -> str:
    text = str(err).removeprefix("Call to collective_rpc method failed: ").strip()
    return text or type(err).__name__


async def _all(jobs: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; if one fails, cancel the rest (aborting their vLLM requests) and re-raise."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
