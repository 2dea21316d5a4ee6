"""What a generator with spec.environment builds at its start: the environment and its prompts,
and the environment's rollouts on the generator's engine (verifiers is imported only here, by a
run that has an environment)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalerl.generator.engine import GenerationEngine
from scalerl.generator.prompts import Example
from scalerl.generator.tokens import ModelTokens
from scalerl.spec import RunSpec

if TYPE_CHECKING:
    from scalerl.agents.rollouts import AgentRollouts


def environment_prompts(
    spec: RunSpec, tokenizer: Any
) -> tuple[Any, list[Example], list[Example], int]:
    """spec.environment loaded, its prompts, and the longest first context among them."""
    from scalerl.agents.load import environment_examples, load_environment
    from scalerl.agents.rollouts import first_context

    assert spec.environment is not None
    environment = load_environment(spec)
    train, validation = environment_examples(environment, spec)
    longest = max(len(first_context(environment, tokenizer, e)) for e in train + validation)
    return environment, train, validation, longest


def agent_rollouts(
    spec: RunSpec, environment: Any, engine: GenerationEngine, tokens: ModelTokens
) -> AgentRollouts:
    """The environment's rollouts on this engine: each model turn sampled under the recipe's
    length rules with what is left of its rollout's budgets (`GenerationEngine.turn`)."""
    from scalerl.agents.client import EngineClient
    from scalerl.agents.rollouts import AgentRollouts

    assert spec.environment is not None
    config = engine.config
    client = EngineClient(engine.turn, tokens, config.max_model_len, config.plan, config.seed)
    return AgentRollouts(environment, client, spec.environment)
