"""The ScaleRLRun spec: defaults are the paper's recipe; every bad field is named with its path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from scalerl.errors import InputError, SpecError
from scalerl.spec import INTERRUPTION_PHRASE, load_run, parse_run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MINIMAL = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "math-8b"},
    "spec": {"model": {"path": "/models/base"}, "data": {"train": "/data/train.jsonl"}},
}


def problems(obj: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_run(obj)
    return info.value.problems


def with_spec(**sections: object) -> dict:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"].update(sections)
    return obj


def test_defaults_are_the_scalerl_recipe() -> None:
    recipe = parse_run(MINIMAL).spec.recipe
    assert recipe.algorithm == "pipelinerl" and recipe.max_off_policy_steps == 8
    assert recipe.loss.type == "cispo" and recipe.loss.epsilon_max == 4.0
    assert recipe.aggregation == "prompt" and recipe.advantage_normalization == "batch"
    assert recipe.zero_variance_filtering and recipe.no_positive_resampling.enabled
    assert recipe.no_positive_resampling.pass_rate_threshold == 0.9
    assert (recipe.batch.prompts, recipe.batch.generations_per_prompt) == (48, 16)
    assert (recipe.optimizer.lr, recipe.optimizer.eps) == (5e-7, 1e-15)
    assert (recipe.optimizer.weight_decay, recipe.optimizer.warmup_steps) == (0.01, 100)
    length = recipe.length
    assert (length.max_prompt_tokens, length.thinking_budget, length.answer_budget) == (
        2048,
        12288,
        2048,
    )
    assert length.interruption.window == (10240, 12288)
    assert length.interruption.phrase == INTERRUPTION_PHRASE
    assert recipe.sampling.temperature == 1.0


def test_loss_variants_take_their_own_defaults() -> None:
    loss = parse_run(with_spec(recipe={"loss": {"type": "dapo"}})).spec.recipe.loss
    assert (loss.epsilon_low, loss.epsilon_high) == (0.2, 0.28)
    loss = parse_run(with_spec(recipe={"loss": {"type": "gspo"}})).spec.recipe.loss
    assert (loss.epsilon_low, loss.epsilon_high) == (3e-3, 4e-3)


def test_unknown_loss_type_is_named_with_its_path() -> None:
    assert problems(with_spec(recipe={"loss": {"type": "cispa"}})) == [
        "spec.recipe.loss.type: 'cispa' is not one of cispo, dapo, gspo, grpo"
    ]


def test_every_bad_field_is_reported_at_once() -> None:
    found = problems(
        with_spec(
            recipe={"aggregation": "mean", "batch": {"prompts": 0}, "bogus": 1},
            generators={"replicas": "many"},
        )
    )
    assert "spec.recipe.aggregation: 'mean' is not one of prompt, sample, token" in found
    assert any(p.startswith("spec.recipe.batch.prompts:") for p in found)
    assert any(p.startswith("spec.recipe.bogus: unknown field") for p in found)
    assert any(p.startswith("spec.generators.replicas:") for p in found)
    assert len(found) == 4


def test_field_of_another_loss_is_rejected() -> None:
    assert problems(with_spec(recipe={"loss": {"type": "cispo", "epsilonLow": 0.2}})) == [
        "spec.recipe.loss.epsilonLow: unknown field (check spelling; fields are camelCase)"
    ]


def test_interruption_window_must_fit_the_thinking_budget() -> None:
    found = problems(with_spec(recipe={"length": {"thinkingBudget": 1000}}))
    assert len(found) == 1 and "thinkingBudget (1000)" in found[0]


def test_missing_sections_and_bad_reward_are_named() -> None:
    obj = copy.deepcopy(MINIMAL)
    del obj["spec"]["model"]
    obj["spec"]["data"]["reward"] = "not a reward"
    found = problems(obj)
    assert "spec.model: required field is missing" in found
    assert any(p.startswith("spec.data.reward: 'not a reward' is not one of") for p in found)


def test_name_must_be_a_dns_label() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["metadata"]["name"] = "Math_8B"
    assert "DNS-1123" in problems(obj)[0]


def test_status_is_ignored_when_loading() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["status"] = {"phase": "Running"}
    assert parse_run(obj).name == "math-8b"


@pytest.mark.parametrize("name", ["run.yaml", "local.yaml"])
def test_examples_are_valid(name: str) -> None:
    assert load_run(EXAMPLES / name).spec.model.path


def test_unreadable_or_invalid_yaml_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read spec file"):
        load_run(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(InputError, match="not valid YAML"):
        load_run(bad)


def test_problems_in_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "apiVersion: scalerl.dev/v1alpha1\nkind: ScaleRLRun\nmetadata: {name: a}\n"
        "spec: {model: {path: /m}, data: {train: /t}, recipe: {loss: {type: x}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_run(path)
    assert info.value.problems == [
        f"{path}: spec.recipe.loss.type: 'x' is not one of cispo, dapo, gspo, grpo"
    ]
