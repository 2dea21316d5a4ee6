"""The ScaleRLRun spec: defaults are the paper's recipe; every bad field is named with its path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.errors import InputError, SpecError
from scalerl.recipe import SamplingFilters
from scalerl.spec import INTERRUPTION_PHRASE, LoraSpec, RunSpec, load_run, parse_run, parse_sweep

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
    assert parse_run(MINIMAL).spec.interruption_phrase == INTERRUPTION_PHRASE
    assert recipe.sampling.temperature == 1.0
    assert recipe.correction.type == "none"  # the paper's: CISPO and an FP32 head, nothing more
    # The sampling filters are off: every token kept, as before they existed.
    assert (recipe.sampling.top_p, recipe.sampling.top_k, recipe.sampling.min_p) == (1.0, 0, 0.0)


def test_a_mismatch_correction_takes_its_defaults_and_names_a_bad_bound() -> None:
    correction = parse_run(
        with_spec(recipe={"correction": {"type": "mask"}})
    ).spec.recipe.correction
    assert (correction.level, correction.low, correction.high) == ("token", 0.5, 2.0)
    assert problems(with_spec(recipe={"correction": {"type": "truncate", "cap": 0.5}})) == [
        "spec.recipe.correction.cap: Input should be greater than or equal to 1, got 0.5"
    ]
    [line] = problems(with_spec(recipe={"correction": {"type": "clip"}}))
    assert line.startswith("spec.recipe.correction.type: 'clip' is not one of none, truncate")


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


def test_a_loss_without_its_type_says_so() -> None:
    assert problems(with_spec(recipe={"loss": {"epsilonMax": 5.0}})) == [
        "spec.recipe.loss.type: required field is missing (one of cispo, dapo, gspo, grpo)"
    ]


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


@pytest.mark.parametrize("name", ["run.yaml", "local.yaml", "colocated.yaml", "lora.yaml"])
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


# --- strict numbers ---------------------------------------------------------------------------

NUMBER_FIELDS = [
    ("recipe", "optimizer", "lr"),
    ("recipe", "optimizer", "eps"),
    ("recipe", "optimizer", "weightDecay"),
    ("recipe", "sampling", "temperature"),
    ("recipe", "sampling", "topP"),
    ("recipe", "sampling", "topK"),
    ("recipe", "sampling", "minP"),
    ("recipe", "loss", "epsilonMax"),
    ("recipe", "correction", "cap"),
    ("recipe", "correction", "high"),
    ("recipe", "batch", "prompts"),
    ("generators", "replicas"),
    ("generators", "gpus"),
    ("trainers", "gpus"),
    ("budget", "maxComputeHours"),
    ("recipe", "length", "answerBudget"),
]


def with_value(path: tuple[str, ...], value: object) -> dict:
    obj = copy.deepcopy(MINIMAL)
    node = obj["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    if path[-2] == "loss":
        node["type"] = "cispo"
    return obj


@pytest.mark.parametrize("path", NUMBER_FIELDS, ids=".".join)
@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, "1e-3", 10**30])
def test_numbers_are_finite_numbers_within_bounds(path: tuple[str, ...], value: object) -> None:
    [line] = problems(with_value(path, value))
    assert line.startswith("spec." + ".".join(path) + ": ")


def test_an_int_is_a_fine_float_but_a_float_is_not_an_int() -> None:
    assert parse_run(with_value(("budget", "maxComputeHours"), 100)).spec.budget.max_compute_hours
    [line] = problems(with_value(("generators", "replicas"), 2.5))
    assert line.startswith("spec.generators.replicas: ")


@settings(max_examples=300, deadline=None)
@given(
    lr=st.floats(allow_nan=True, allow_infinity=True),
    replicas=st.one_of(st.integers(), st.booleans(), st.text(max_size=3)),
    temperature=st.one_of(st.floats(), st.integers(-5, 20)),
)
def test_any_number_is_accepted_or_named(lr: float, replicas: object, temperature: float) -> None:
    obj = with_spec(
        recipe={"optimizer": {"lr": lr}, "sampling": {"temperature": temperature}},
        generators={"replicas": replicas},
    )
    try:
        spec = parse_run(obj).spec
    except SpecError as err:
        assert all(p.startswith("spec.") for p in err.problems)
        return
    assert 0 < spec.recipe.optimizer.lr <= 1 and 0 < spec.recipe.sampling.temperature <= 10
    assert isinstance(spec.generators.replicas, int) and 1 <= spec.generators.replicas <= 10_000


# --- sampling filters ------------------------------------------------------------------------


def test_sampling_filters_are_read_in_camel_case() -> None:
    sampling = {"temperature": 0.7, "topP": 0.95, "topK": 40, "minP": 0.05}
    spec = parse_run(with_spec(recipe={"sampling": sampling})).spec
    got = spec.recipe.sampling
    assert (got.temperature, got.top_p, got.top_k, got.min_p) == (0.7, 0.95, 40, 0.05)


@pytest.mark.parametrize(
    ("sampling", "problem"),
    [
        ({"topP": 0}, "spec.recipe.sampling.topP: Input should be greater than 0, got 0"),
        ({"topP": 1.5}, "spec.recipe.sampling.topP: Input should be less than or equal to 1"),
        ({"topK": 2.5}, "spec.recipe.sampling.topK: Input should be a valid integer"),
        ({"topK": -3}, "spec.recipe.sampling.topK: Input should be greater than or equal to 0"),
        ({"topK": -1}, "spec.recipe.sampling.topK: must be >= 0: 0 turns top-k off"),
        ({"minP": -0.1}, "spec.recipe.sampling.minP: Input should be greater than or equal to 0"),
        ({"minP": 2}, "spec.recipe.sampling.minP: Input should be less than or equal to 1"),
    ],
)
def test_bad_sampling_filters_are_named_with_their_bounds(
    sampling: dict[str, object], problem: str
) -> None:
    [line] = problems(with_spec(recipe={"sampling": sampling}))
    assert line.startswith(problem)


@settings(max_examples=200, deadline=None)
@given(
    top_p=st.one_of(st.floats(), st.integers(-2, 3)),
    top_k=st.one_of(st.integers(-5, 1 << 25), st.floats(), st.booleans()),
    min_p=st.one_of(st.floats(), st.integers(-2, 3)),
)
def test_any_sampling_filter_is_accepted_or_named(
    top_p: object, top_k: object, min_p: object
) -> None:
    obj = with_spec(recipe={"sampling": {"topP": top_p, "topK": top_k, "minP": min_p}})
    try:
        sampling = parse_run(obj).spec.recipe.sampling
    except SpecError as err:
        assert all(p.startswith("spec.recipe.sampling.") for p in err.problems)
        return
    assert 0 < sampling.top_p <= 1 and 0 <= sampling.min_p <= 1
    assert isinstance(sampling.top_k, int) and 0 <= sampling.top_k <= 1 << 24
    SamplingFilters.of(sampling)  # what the generators and the trainer are given is valid


# --- thinking is optional -------------------------------------------------------------------


def test_a_model_that_does_not_think_must_not_be_interrupted() -> None:
    assert problems(with_spec(model={"path": "/m", "thinkEnd": None})) == [
        "spec.recipe.length.interruption.enabled: must be false when model.thinkEnd is null "
        "(a model that does not think cannot be interrupted)"
    ]
    spec = parse_run(
        with_spec(
            model={"path": "/m", "thinkEnd": None},
            recipe={"length": {"answerBudget": 64, "interruption": {"enabled": False}}},
        )
    ).spec
    assert not spec.thinks and spec.max_completion_tokens == 64


def test_a_disabled_interruption_is_not_validated() -> None:
    length = {"thinkingBudget": 100, "interruption": {"enabled": False}}
    assert parse_run(with_spec(recipe={"length": length})).spec.recipe.length.thinking_budget == 100


def test_the_phrase_ends_with_the_models_own_think_end() -> None:
    spec = parse_run(with_spec(model={"path": "/m", "thinkEnd": "<|/think|>"})).spec
    assert spec.interruption_phrase.endswith("answer now. <|/think|>")


def test_failure_policy_and_stop_when_have_defaults() -> None:
    spec = parse_run(with_spec(budget={"stopWhen": {"predictedABelow": 0.5}})).spec
    assert spec.failure_policy.max_restarts == 3 and spec.failure_policy.no_signal_steps == 50
    assert spec.budget.stop_when is not None and spec.budget.stop_when.min_points == 8


def test_tolerations_follow_the_rules_of_the_api_server() -> None:
    found = problems(
        with_spec(
            scheduling={
                "tolerations": [
                    {"operator": "Equal", "value": "x"},
                    {"key": "a", "operator": "Exists", "value": "x"},
                    {"key": "a", "effect": "NoSchedule", "tolerationSeconds": 30},
                ]
            }
        )
    )
    assert found == [
        "spec.scheduling.tolerations.0.operator: must be Exists when key is absent (a toleration "
        "of every taint)",
        "spec.scheduling.tolerations.1.value: must be absent with operator Exists",
        "spec.scheduling.tolerations.2.tolerationSeconds: applies only to effect NoExecute",
    ]


def test_a_queue_belongs_to_the_whole_run_and_is_a_dns_label() -> None:
    found = problems(
        with_spec(
            scheduling={"queueName": "Team_GPUs"}, trainers={"scheduling": {"queueName": "q"}}
        )
    )
    assert [p.split(":")[0] for p in found] == [
        "spec.trainers.scheduling.queueName",  # one queue admits the whole gang
        "spec.scheduling.queueName",
    ]


def test_affinity_and_class_names_are_checked_where_they_are_written() -> None:
    node_term = {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["a"]}]}
    found = problems(
        with_spec(
            generators={
                "scheduling": {
                    "priorityClassName": "High_Priority",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [node_term]
                            }
                        }
                    },
                }
            }
        )
    )
    assert [p.split(":")[0] for p in found] == [
        "spec.generators.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
        "Execution.nodeSelectorTerms.0.matchExpressions.0.values",
        "spec.generators.scheduling.priorityClassName",
    ]


def with_model(**model: object) -> dict:
    """MINIMAL with `model` fields."""
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["model"].update(model)
    return obj


def test_lora_defaults_on_any_number_of_trainer_ranks() -> None:
    spec = parse_run(with_model(lora={})).spec
    assert spec.model.lora == LoraSpec(rank=16, alpha=32, dropout=0.0, target_modules=None)
    # The default trainers, 2 replicas of 8 GPUs: 16 ranks shard the adapter as any weights.
    sharded = copy.deepcopy(MINIMAL)
    sharded["spec"]["model"]["lora"] = {"rank": 8}
    assert parse_run(sharded).spec.model.lora == LoraSpec(rank=8)
    wrong = [
        ({"rank": 0}, "rank"),
        ({"dropout": 1.0}, "dropout"),
        ({"targetModules": []}, "targetModules"),
        ({"alpha": 0.5}, "alpha"),
    ]
    for bad, field in wrong:
        assert problems(with_model(lora=bad))[0].startswith(f"spec.model.lora.{field}:"), bad


# --- nothing at the top but the object's own fields ----------------------------------------------

TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}
SWEEP = yaml.safe_load((EXAMPLES / "sweep.yaml").read_text())


def sweep_problems(obj: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_sweep(obj)
    return info.value.problems


def test_a_block_indented_one_level_too_little_is_refused_by_name(tmp_path: Path) -> None:
    # The audit's S10: examples/local.yaml with its budget at column 0 was "valid", with the
    # default budget (10000 steps, 16000 compute) instead of the file's (100, 0.5).
    obj = yaml.safe_load((EXAMPLES / "local.yaml").read_text())
    obj["budget"] = obj["spec"].pop("budget")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(obj))
    with pytest.raises(SpecError) as info:
        load_run(path)
    assert info.value.problems == [
        f"{path}: budget: not a top-level field of a ScaleRLRun (those are apiVersion, kind, "
        "metadata, spec and status); did you mean spec.budget? (move it under spec)"
    ]


@pytest.mark.parametrize("field", sorted(f.alias or n for n, f in RunSpec.model_fields.items()))
def test_every_spec_block_at_the_top_says_where_it_belongs(field: str) -> None:
    obj = copy.deepcopy(MINIMAL)
    obj[field] = {}
    [line] = problems(obj)
    assert line.startswith(f"{field}: not a top-level field of a ScaleRLRun")
    assert line.endswith(f"did you mean spec.{field}? (move it under spec)")


@pytest.mark.parametrize("field", ["earlyStop", "maxParallel", "variants", "base"])
def test_a_sweep_field_at_the_top_says_where_it_belongs(field: str) -> None:
    # B13: `earlyStop` at the top of a sweep file was ignored, and every variant ran to its end.
    obj = copy.deepcopy(SWEEP)
    obj[field] = copy.deepcopy(obj["spec"][field])
    [line] = sweep_problems(obj)
    assert line.startswith(f"{field}: not a top-level field of a ScaleRLSweep")
    assert line.endswith(f"did you mean spec.{field}? (move it under spec)")


def test_a_run_field_at_the_top_of_a_sweep_belongs_in_its_base() -> None:
    obj = copy.deepcopy(SWEEP)
    obj["budget"] = obj["spec"]["base"].pop("budget")
    [line] = sweep_problems(obj)
    assert line.endswith("did you mean spec.base.budget? (move it under spec.base)")


def test_metadata_fields_at_the_top_point_to_metadata() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["labels"] = {"team": "rl"}
    [line] = problems(obj)
    assert line.endswith("did you mean metadata.labels? (move it under metadata)")


@settings(max_examples=200, deadline=None)
@given(key=st.text(min_size=1, max_size=30).filter(lambda k: k not in TOP_LEVEL))
def test_any_unknown_top_level_key_is_refused_by_name(key: str) -> None:
    obj = copy.deepcopy(MINIMAL)
    obj[key] = 1
    assert any(p.startswith(f"{key}: not a top-level field of a ScaleRLRun") for p in problems(obj))
    sweep = copy.deepcopy(SWEEP)
    sweep[key] = 1
    found = sweep_problems(sweep)
    assert any(p.startswith(f"{key}: not a top-level field of a ScaleRLSweep") for p in found)


@settings(max_examples=100, deadline=None)
@given(
    extra=st.dictionaries(
        st.text(min_size=1, max_size=20).filter(lambda k: k not in {"name", "namespace"}),
        st.one_of(st.none(), st.text(), st.integers(), st.dictionaries(st.text(), st.text())),
        max_size=5,
    )
)
def test_what_kubernetes_adds_to_a_live_object_is_accepted(extra: dict) -> None:
    # The operator parses objects read from the cluster: metadata full of the API server's
    # fields, and a status beside the spec.
    live = {"uid": "1f0c", "resourceVersion": "42", "generation": 3, "managedFields": [{}]}
    for obj, parse in ((copy.deepcopy(MINIMAL), parse_run), (copy.deepcopy(SWEEP), parse_sweep)):
        obj["metadata"] |= {**live, "labels": {"a": "b"}, "annotations": {"c": "d"}, **extra}
        obj["status"] = {"phase": "Running", "anything": [1, 2]}
        assert parse(obj).name == obj["metadata"]["name"]


# --- numbers that contradict each other or do nothing ------------------------------------------


def test_no_off_policy_lag_is_refused_saying_what_it_would_do() -> None:
    # B14: 0 was accepted; pipelinerl dropped the groups in flight at every update, and
    # ppo-off-policy silently ran 1 step per batch.
    [line] = problems(with_spec(recipe={"maxOffPolicySteps": 0}))
    assert line.startswith("spec.recipe.maxOffPolicySteps: must be >= 1: with pipelinerl, 0 ")
    assert "dropped as stale" in line
    [line] = problems(with_spec(recipe={"algorithm": "ppo-off-policy", "maxOffPolicySteps": 0}))
    assert line == (
        "spec.recipe.maxOffPolicySteps: must be >= 1: with ppo-off-policy it is the optimizer "
        "steps taken on each generated batch, and 0 steps would train nothing"
    )
    for algorithm in ("pipelinerl", "ppo-off-policy"):
        recipe = {"algorithm": algorithm, "maxOffPolicySteps": 1}
        assert parse_run(with_spec(recipe=recipe)).spec.recipe.max_off_policy_steps == 1


@settings(max_examples=200, deadline=None)
@given(warmup=st.integers(0, 2000), steps=st.integers(20, 2000))
def test_a_warmup_longer_than_the_run_is_refused_naming_both(warmup: int, steps: int) -> None:
    # B15: the configured lr was never reached, without a word.
    obj = with_spec(
        recipe={"optimizer": {"warmupSteps": warmup}},
        budget={"maxSteps": steps},
        evaluation={"everySteps": 1},  # enough evaluations for a fit at any of these budgets
    )
    if warmup <= steps:
        assert parse_run(obj).spec.recipe.optimizer.warmup_steps == warmup
        return
    assert problems(obj) == [
        f"spec.recipe.optimizer.warmupSteps: {warmup} is more than budget.maxSteps {steps}: the "
        "learning rate would still be rising when the run ends and never reach lr 5e-07; set "
        f"warmupSteps to {steps} or less"
    ]


def test_the_default_warmup_is_named_as_the_default() -> None:
    [line] = problems(with_spec(budget={"maxSteps": 50}, evaluation={"everySteps": 5}))
    assert line.startswith("spec.recipe.optimizer.warmupSteps: 100 (the default) is more than")


# --- a spec that can never give a fit (F16, B2, B3) ---------------------------------------------


def test_the_compute_floor_defaults_to_a_fraction_of_the_run_s_compute() -> None:
    # It was an absolute 1500 GPU-hours: a local run (process-hours) never got a fit.
    assert parse_run(MINIMAL).spec.fit.min_compute is None


def test_a_floor_at_or_above_the_compute_budget_is_refused_naming_both() -> None:
    obj = with_spec(fit={"minCompute": 0.5}, budget={"maxComputeHours": 0.5})
    assert problems(obj) == [
        "spec.fit.minCompute: must be below budget.maxComputeHours (0.5): every evaluation would "
        "lie below it and no fit could be made; got 0.5"
    ]


def rounds_evaluated(steps: int, every: int, k: int) -> list[int]:
    """Step 0, then the trainer's rounds of k steps (the last cut at `steps`), each evaluating
    once after it if one of its steps is a multiple of `every`, and the last step."""
    evaluated, step = [0], 0
    while step < steps:
        taken = range(step + 1, min(step + k, steps) + 1)
        step = taken[-1]
        if any(s % every == 0 for s in taken):
            evaluated.append(step)
    return evaluated if evaluated[-1] == steps else [*evaluated, steps]


@settings(max_examples=200, deadline=None)
@given(
    every=st.integers(1, 400),
    steps=st.integers(1, 1000),
    floor=st.sampled_from([None, 0.0, 1.0]),
    ppo_k=st.sampled_from([None, 1, 2, 3, 8]),
)
def test_a_schedule_with_too_few_evaluations_for_a_fit_is_refused(
    every: int, steps: int, floor: float | None, ppo_k: int | None
) -> None:
    evaluated = rounds_evaluated(steps, every, ppo_k or 1)
    if ppo_k is None:  # pipelinerl: step 0, every `every` steps and the last, counted by hand
        assert evaluated == sorted({0, steps, *range(0, steps + 1, every)})
    # The fitter needs 4 points past the floor; only a floor of 0 keeps step 0 (compute 0).
    needed = 4 if floor == 0.0 else 5
    recipe: dict[str, Any] = {"optimizer": {"warmupSteps": 0}}
    if ppo_k is not None:
        recipe |= {"algorithm": "ppo-off-policy", "maxOffPolicySteps": ppo_k}
    obj = with_spec(
        evaluation={"everySteps": every},
        budget={"maxSteps": steps, "maxComputeHours": 10.0},
        fit={"minCompute": floor},
        recipe=recipe,
    )
    if len(evaluated) >= needed:
        assert parse_run(obj).spec.evaluation.every_steps == every
        return
    [line] = problems(obj)
    assert line.startswith(
        f"spec.evaluation.everySteps: {every} gives {len(evaluated)} evaluations within "
        f"budget.maxSteps {steps}"
    )
    assert f"a fit needs {needed}" in line
