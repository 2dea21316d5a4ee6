"""The HF evaluators sample as the generators do: HF's own warpers, chained in vLLM's order after
the temperature, keep the tokens the trainer's filters keep (scalerl.recipe.sampling), which is
an independent implementation of the same distribution."""

from __future__ import annotations

import pytest
import torch

from scalerl.hfeval_result import sampling_settings
from scalerl.recipe import SamplingFilters, kept_tokens

SETTINGS = {
    "top-p 0.8": SamplingFilters(top_p=0.8),
    "top-k 5": SamplingFilters(top_k=5),
    "min-p 0.1": SamplingFilters(min_p=0.1),
    # min-p before top-p: HF's built-in order (top-p, then min-p) keeps more tokens here.
    "min-p 0.2, top-p 0.6": SamplingFilters(top_p=0.6, min_p=0.2),
    "all three": SamplingFilters(top_p=0.9, top_k=8, min_p=0.02),
}


@pytest.mark.parametrize("filters", SETTINGS.values(), ids=SETTINGS.keys())
def test_hf_warpers_keep_the_tokens_the_trainer_keeps(filters: SamplingFilters) -> None:
    logits = 3 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    config, processors = sampling_settings(0.7, filters)
    assert config["temperature"] == 1.0  # the chain applies it, before the filters
    ids = torch.zeros(64, 1, dtype=torch.long)
    scores = processors(ids, logits.clone())  # type: ignore[arg-type]  # HF's legacy tensor types
    hf_kept = scores > -torch.inf
    ours = kept_tokens(logits / 0.7, filters)
    assert torch.equal(hf_kept, ours)
    assert not bool(ours.all())
    # The log-probs HF's sampler reports are the trainer's.
    torch.testing.assert_close(
        scores.log_softmax(-1)[ours],
        (logits / 0.7).masked_fill(~ours, -torch.inf).log_softmax(-1)[ours],
    )


def test_without_filters_the_config_alone_samples_at_the_temperature() -> None:
    config, processors = sampling_settings(0.7, SamplingFilters())
    assert config == {"temperature": 0.7, "top_k": 0, "top_p": 1.0} and len(processors) == 0
