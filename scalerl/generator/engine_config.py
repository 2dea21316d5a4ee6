"""What a generator's engine is started with: its config (sliced from the run spec by the
generator process), the environment vLLM reads at import, and the engine arguments a CPU needs."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalerl.environment import ProcessEnv
from scalerl.errors import InputError
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters
from scalerl.spec import THINK_END, LoraSpec, RunSpec

Dtype = Literal["float32", "bfloat16", "float16"]
# vLLM's own default for an engine on a CPU: tokens one engine step may compute.
CPU_BATCHED_TOKENS = 4096
# vLLM's own defaults on a CPU: sequences one engine step may hold (its max_num_seqs), and the
# tokens of one KV cache block (a sequence takes whole blocks).
CPU_SEQUENCES = 256
CPU_BLOCK_TOKENS = 128
# The KV cache on a CPU holds CPU_SEQUENCES sequences of max_model_len, within these bounds: vLLM
# zeroes the whole cache at start (a GiB took ~2 s of every generator start on 2 cores, for a
# test model whose 256 longest sequences need 64 MiB).
KV_CACHE_MIN_BYTES = 32 * 2**20
KV_CACHE_MAX_BYTES = 2**30


@dataclass(frozen=True)
class EngineConfig:
    """What a generator's engine needs, sliced from the run spec by the generator process.

    `fp32_lm_head`: compute the logits in FP32 (paper: raises the asymptote 0.52 -> 0.61); vLLM
    does it natively with `hf_overrides={"head_dtype": "float32"}`. `temperature`: sampling
    temperature; `filters`: top-p, top-k and min-p (default: off); recorded log-probs are of the
    tempered, filtered distribution (scalerl.recipe.sampling). `seed`: seeds vLLM and the
    cutoff draws. `kv_cache_bytes`: KV cache size on CPU (None: sized for the model,
    `cpu_kv_cache_bytes`; ignored on GPUs, which size it from free memory). `run_dir`: where
    vLLM's IPC sockets go (a fresh temporary directory if None).
    `lora`: serve the base with one adapter slot; each version is an adapter
    (`scalerl.generator.adapters`). `separate_process`: vLLM's engine core in a process of its
    own (`AsyncLLM`) or in this one (`scalerl.generator.inproc`); None: its own on an accelerator,
    where it schedules while the device computes, and this one on a CPU, where vLLM would have to
    spawn it (a second interpreter importing vLLM and torch again: ~16 s of every start on 2
    cores) for no overlap on the cores they share.
    """

    model_path: str
    dtype: Dtype
    fp32_lm_head: bool
    max_model_len: int
    temperature: float
    seed: int
    phrase: str
    plan: InterruptionPlan
    think_end: str | None = THINK_END  # None: a model that does not think (one answer phase)
    kv_cache_bytes: int | None = None
    run_dir: str | None = None
    lora: LoraSpec | None = None
    separate_process: bool | None = None
    filters: SamplingFilters = NO_FILTERS

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise InputError(f"dtype must be float32, bfloat16 or float16; got {self.dtype!r}")
        if self.max_model_len <= 0:
            raise InputError(f"max_model_len must be > 0 tokens; got {self.max_model_len}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0; got {self.temperature}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise InputError(f"kv_cache_bytes must be > 0; got {self.kv_cache_bytes}")


def prepare_vllm_environment(config: EngineConfig) -> None:
    """Set the environment vLLM reads at import and start-up; call before importing vllm.

    Idempotent. On CPU: no TorchDynamo (the first log-prob request would stall compiling a
    kernel), a single engine-core process. (The KV cache's size is an engine argument,
    `cpu_kv_cache_bytes`: vLLM's default sizing fails on small VMs.)
    """
    os.environ["VLLM_RPC_BASE_PATH"] = str(_rpc_dir(config))  # else sockets pile up in $TMPDIR
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def cpu_kv_cache_bytes(config: EngineConfig) -> int:
    """The KV cache of an engine on a CPU: `config.kv_cache_bytes` where set, else room for
    CPU_SEQUENCES sequences of max_model_len (in whole blocks) of this model (keys and values of
    every layer, in its dtype), within KV_CACHE_MIN_BYTES and KV_CACHE_MAX_BYTES; the most where
    the model's config does not say its shape."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    from transformers import AutoConfig

    try:
        text = AutoConfig.from_pretrained(config.model_path).get_text_config()
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        layers = int(text.num_hidden_layers)
    except (OSError, ValueError, AttributeError, TypeError):
        return KV_CACHE_MAX_BYTES
    width = 4 if config.dtype == "float32" else 2
    per_token = 2 * layers * kv_heads * head_dim * width
    blocks = -(-config.max_model_len // CPU_BLOCK_TOKENS)
    need = per_token * blocks * CPU_BLOCK_TOKENS * CPU_SEQUENCES
    return min(KV_CACHE_MAX_BYTES, max(KV_CACHE_MIN_BYTES, need))


def _rpc_dir(config: EngineConfig) -> Path:
    """Where vLLM puts its IPC sockets: the run directory if its path is short enough."""
    # vLLM names sockets <dir>/<uuid4>; a Unix socket path holds at most 107 bytes.
    limit = 107 - 37
    wanted = Path(config.run_dir) / "vllm-rpc" if config.run_dir else None
    if wanted is None or len(str(wanted)) > limit:
        current = os.environ.get("VLLM_RPC_BASE_PATH", "")
        reuse = "scalerl-vllm-" in current and len(current) <= limit
        wanted = Path(current) if reuse else Path(tempfile.mkdtemp(prefix="scalerl-vllm-"))
    wanted.mkdir(parents=True, exist_ok=True)
    return wanted


def whole_prefills(config: EngineConfig) -> dict[str, Any]:
    """On a CPU, prompts are prefilled whole: vLLM rewinds a seeded request's generator after a
    partial prefill, which a CPU generator cannot do ("CPU Generator does not use offset"), so
    chunked prefill and seeded requests cannot meet there. A prompt that does not fit a step's
    token budget waits for the next step instead."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(config.max_model_len, CPU_BATCHED_TOKENS),
    }


def engine_config(spec: RunSpec, env: ProcessEnv, max_model_len: int) -> EngineConfig:
    """The engine's slice of the spec; `max_model_len` is measured (`model_len_needed`)."""
    return EngineConfig(
        model_path=spec.model.path,
        dtype=spec.model.dtype,
        fp32_lm_head=spec.model.fp32_lm_head,
        max_model_len=max_model_len,
        temperature=spec.recipe.sampling.temperature,
        filters=SamplingFilters.of(spec.recipe.sampling),
        seed=spec.seed * 1000 + env.generator_index,
        phrase=spec.interruption_phrase,
        think_end=spec.model.think_end,
        plan=InterruptionPlan.of(spec.recipe.length),
        run_dir=str(env.run_dir / f"vllm-{env.generator_index}"),
        lora=spec.model.lora,
    )
