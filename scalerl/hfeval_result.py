"""A held-out evaluation's result as both evaluators count it (`scalerl.hfeval`: one completion
per prompt; `scalerl.hfeval_env`: an agent run's rollouts), and the generation config and sampling
settings both sample under. Both import it; it imports neither."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters
from scalerl.status.history import PromptScore


@dataclass(frozen=True)
class Evaluation:
    """Mean@k held-out pass rate of one model; totals are counted over the samples themselves."""

    checkpoint: str
    k: int
    seed: int
    temperature: float
    per_prompt: tuple[PromptScore, ...]
    prompts: int
    samples: int
    correct: int
    truncated: int
    pass_rate: float  # correct / samples, samples = prompts x k
    stderr: float  # std of the per-prompt means (ddof 1) / sqrt(prompts); 0.0 for one prompt
    seconds: float  # wall time of the sampling and scoring
    # Prompts of several domains: each one's {pass_rate, pass_rate_se, prompts, samples,
    # correct}, counted the same way over its own prompts ({} for one domain).
    by_domain: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Samples that could not be scored (among `samples`, counted as not passed), and why.
    unscored: int = 0
    unscored_reasons: dict[str, int] = field(default_factory=dict)
    filters: SamplingFilters = NO_FILTERS  # recipe.sampling's top-p, top-k and min-p it used

    def summary(self) -> str:
        domains = "".join(
            f"; {d} {part['pass_rate']:.3f} ± {part['pass_rate_se']:.3f} ({part['prompts']})"
            for d, part in self.by_domain.items()
        )
        why = ", ".join(f"{reason} {n}" for reason, n in self.unscored_reasons.items())
        unscored = f", {self.unscored} unscored ({why}) counted as failed" if self.unscored else ""
        return (
            f"pass rate {self.pass_rate:.3f} ± {self.stderr:.3f} (mean@{self.k} over "
            f"{self.prompts} prompts, {self.samples} samples{unscored}){domains}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def domain_rates(per_prompt: Sequence[PromptScore]) -> dict[str, dict[str, Any]]:
    """Each domain's rates when the prompts span several ({} for one domain)."""
    domains = sorted({p.domain for p in per_prompt})
    if len(domains) < 2:
        return {}
    return {d: _domain_rate([p for p in per_prompt if p.domain == d]) for d in domains}


def _domain_rate(scores: list[PromptScore]) -> dict[str, Any]:
    """One domain's mean@k over its prompts, its standard error and counts."""
    means = [p.correct / p.samples for p in scores if p.samples]
    samples, correct = sum(p.samples for p in scores), sum(p.correct for p in scores)
    return {
        "pass_rate": correct / samples,
        "pass_rate_se": statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0,
        "prompts": len(scores),
        "samples": samples,
        "correct": correct,
    }


@contextmanager
def plain_generation_config(model: Any) -> Iterator[None]:
    """The model's own generation_config.json could add sampling settings (top_k 50, a
    repetition penalty) to ours; `generate` sees the library's defaults instead meanwhile."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def sampling_settings(
    temperature: float, filters: SamplingFilters
) -> tuple[dict[str, Any], LogitsProcessorList]:
    """`GenerationConfig`'s sampling fields and `generate`'s logits processors that sample as the
    generators do: at `temperature`, then `recipe.sampling`'s filters in vLLM's order (min-p,
    top-k, top-p: scalerl.recipe.sampling), each by HF's own warper. HF's built-in order differs
    (top-k, top-p, then min-p, which with top-p on keeps another set; and processors passed in
    run before its temperature), so with a filter on the whole chain is passed as processors and
    the config's temperature is 1. With the filters off: the temperature alone, as before."""
    plain: dict[str, Any] = {"temperature": temperature, "top_k": 0, "top_p": 1.0}
    if not filters.on:
        return plain, LogitsProcessorList()
    chain: list[Any] = [TemperatureLogitsWarper(temperature)]
    if filters.min_p > 0:
        chain.append(MinPLogitsWarper(filters.min_p))
    if filters.top_k > 0:
        chain.append(TopKLogitsWarper(filters.top_k))
    if filters.top_p < 1:
        chain.append(TopPLogitsWarper(filters.top_p))
    return plain | {"temperature": 1.0}, LogitsProcessorList(chain)
