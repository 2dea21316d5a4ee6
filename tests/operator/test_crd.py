"""The ScaleRLRun CRD agrees with scalerl.spec: same defaults, accepts every valid spec, and
its CEL rules say what the spec's validators say."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from crdcheck import admit, apply_defaults, cel_errors, structural_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from scalerl.errors import SpecError
from scalerl.operator import crd
from scalerl.spec import RunSpec, parse_run

ROOT = Path(__file__).resolve().parents[2]
CRD = crd.build_crd()
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
MINIMAL = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "math-8b"},
    "spec": {"model": {"path": "/models/base"}, "data": {"train": "/data/train.jsonl"}},
}


def with_spec(**spec: Any) -> dict[str, Any]:
    run = copy.deepcopy(MINIMAL)
    run["spec"].update(spec)
    return run


@pytest.mark.parametrize("path", [crd.CRD_FILE, crd.CHART_CRD_FILE], ids=str)
def test_committed_crd_files_are_a_fresh_generation(path: Path) -> None:
    committed = (ROOT / path).read_text()
    assert committed == crd.render_crd(), f"{path} is stale: run `make crds`"


def test_crd_names_the_resource_as_documented() -> None:
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == "scalerlruns.scalerl.dev"
    assert (names["kind"], names["plural"]) == ("ScaleRLRun", "scalerlruns")
    assert names["shortNames"] == ["srl"] and names["categories"] == ["scalerl"]
    assert VERSION["name"] == "v1alpha1" and VERSION["subresources"] == {"status": {}}


def test_printer_columns_show_phase_progress_and_prediction() -> None:
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.progress.step",
        "PassRate": ".status.progress.evalPassRate",
        "A": ".status.prediction.A",
        "C_mid": ".status.prediction.C_mid",
        "Trunc": ".status.progress.truncationRate",
        "Age": ".metadata.creationTimestamp",
    }
    status = SCHEMA["properties"]["status"]["properties"]
    for path in columns.values():
        parts = path.strip(".").split(".")
        if parts[0] == "status":  # every column names a field of the status schema
            node = status[parts[1]]
            for part in parts[2:]:
                node = node["properties"][part]


def test_schema_is_structural() -> None:
    assert structural_problems(SCHEMA) == []


def test_loss_union_is_one_object_tagged_by_type() -> None:
    loss = SPEC["properties"]["recipe"]["properties"]["loss"]
    assert loss["properties"]["type"]["enum"] == ["cispo", "dapo", "grpo", "gspo"]
    assert loss["required"] == ["type"]
    assert loss["default"] == {"type": "cispo", "epsilonMax": 4.0}
    window = SPEC["properties"]["recipe"]["properties"]["length"]["properties"]["interruption"]
    assert window["properties"]["window"]["minItems"] == window["properties"]["window"]["maxItems"]


def test_defaults_fill_a_minimal_spec_as_pydantic_does() -> None:
    filled = apply_defaults(SPEC, MINIMAL["spec"])
    parsed = RunSpec.model_validate(MINIMAL["spec"]).model_dump(by_alias=True, mode="json")
    assert filled == _without_nulls(parsed)


def _without_nulls(value: Any) -> Any:
    """Absent and null mean the same; pydantic dumps empty free maps the CRD leaves absent."""
    if isinstance(value, dict):
        kept = {k: _without_nulls(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in kept.items() if v != {} or k not in ("resources",)}
    return value


def _schema_defaults(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple]:
    found = [(path, node["default"])] if "default" in node else []
    for name, sub in (node.get("properties") or {}).items():
        found += _schema_defaults(sub, (*path, name))
    return found


def _pydantic_default(path: tuple[str, ...]) -> Any:
    model: type[BaseModel] = RunSpec
    field = None
    for part in path:
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == part)
        annotation = field.annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)]
        candidates = [annotation, *inner]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), model
        )
    assert field is not None
    default = field.get_default(call_default_factory=True)
    return (
        default.model_dump(by_alias=True, mode="json")
        if isinstance(default, BaseModel)
        else default
    )


@pytest.mark.parametrize(("path", "default"), _schema_defaults(SPEC), ids=lambda v: str(v))
def test_every_crd_default_is_the_spec_default(path: tuple[str, ...], default: Any) -> None:
    expected = _pydantic_default(path)
    if isinstance(default, dict) and default == {}:
        assert isinstance(expected, dict)  # {}: the nested defaults fill it (checked one by one)
    else:
        assert default == (list(expected) if isinstance(expected, tuple) else expected)


@pytest.mark.parametrize("example", ["run.yaml", "local.yaml", "colocated.yaml"])
def test_examples_are_admitted(example: str) -> None:
    run = yaml.safe_load((ROOT / "examples" / example).read_text())
    _, errors = admit(SCHEMA, run)
    assert errors == []


# --- CEL rules: the cross-field validators of scalerl.spec and immutability -------------------

needs_cel = pytest.mark.skipif(
    importlib.util.find_spec("celpy") is None, reason="cel-python (test extra) not installed"
)


def rejected(run: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    stored, errors = admit(SCHEMA, run, None if old is None else admit(SCHEMA, old)[0])
    return errors


@needs_cel
def test_cel_rejects_interruption_of_a_model_that_does_not_think() -> None:
    run = with_spec(model={"path": "/m", "thinkEnd": None})
    assert any("thinkEnd is null" in e for e in rejected(run))
    run["spec"]["recipe"] = {"length": {"interruption": {"enabled": False}}}
    assert rejected(run) == []


@needs_cel
def test_cel_rejects_a_window_outside_the_thinking_budget() -> None:
    length = {"thinkingBudget": 100, "interruption": {"window": [50, 200]}}
    assert any("window" in e for e in rejected(with_spec(recipe={"length": length})))
    length["interruption"]["window"] = [50, 100]
    assert rejected(with_spec(recipe={"length": length})) == []


@needs_cel
def test_cel_keeps_loss_parameters_to_their_loss() -> None:
    errors = rejected(with_spec(recipe={"loss": {"type": "dapo", "epsilonMax": 4.0}}))
    assert errors == [".spec.recipe.loss: epsilonMax applies only to type cispo"]
    assert rejected(with_spec(recipe={"loss": {"type": "gspo", "epsilonLow": 0.003}})) == []


@needs_cel
@pytest.mark.parametrize(
    "edit",
    [
        {"model": {"path": "/models/other"}},
        {"recipe": {"batch": {"prompts": 8}}},
        {"seed": 7},
        {"checkpoint": {"claimName": "elsewhere"}},
    ],
)
def test_cel_forbids_changing_what_defines_the_experiment(edit: dict[str, Any]) -> None:
    old = with_spec(checkpoint={"claimName": "ckpt"})
    new = copy.deepcopy(old)
    new["spec"].update(edit)
    assert any("immutable" in e for e in rejected(new, old))


@needs_cel
def test_cel_keeps_a_colocated_run_to_one_process() -> None:
    # The defaults (8 generators, 2 trainer ranks, 8 GPUs each) are a disaggregated run's.
    errors = rejected(with_spec(placement="colocated"))
    assert any("placement colocated runs one process" in e for e in errors)

    def one(gpus: int) -> dict[str, int]:
        return {"replicas": 1, "gpus": gpus}

    assert rejected(with_spec(placement="colocated", trainers=one(1), generators=one(1))) == []
    assert rejected(with_spec(placement="colocated", trainers=one(0), generators=one(1))) != []


@needs_cel
def test_cel_forbids_changing_the_placement_of_a_run() -> None:
    old = with_spec()
    one = {"replicas": 1, "gpus": 1}
    new = with_spec(placement="colocated", trainers=one, generators=dict(one))
    assert any("placement is immutable" in e for e in rejected(new, old))


@needs_cel
def test_cel_allows_changing_budget_and_suspend() -> None:
    old = with_spec()
    new = with_spec(budget={"maxSteps": 20000}, suspend=True, generators={"replicas": 4})
    assert rejected(new, old) == []


@needs_cel
def test_cel_limits_run_names_to_what_child_names_allow() -> None:
    run = with_spec()
    run["metadata"]["name"] = "7-" + "x" * 10
    assert any("metadata.name" in e for e in rejected(run))
    run["metadata"]["name"] = "a" * 48
    assert any("metadata.name" in e for e in rejected(run))


# --- property: whatever scalerl.spec accepts, the CRD accepts (and defaults the same) ---------


def _rarely(valid: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `valid`: a spec has dozens of fields, so frequent bad values would leave hardly any
    spec valid, and only valid specs test the property."""
    return st.integers(0, 15).flatmap(lambda k: bad if k == 0 else valid)


def _numbers(node: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    lo, hi = node.get("minimum", -(10**6)), node.get("maximum", 10**6)
    step = 1 if integer else 1e-9
    low = lo + step if node.get("exclusiveMinimum") else lo
    high = hi - step if node.get("exclusiveMaximum") else hi
    inside = (
        st.integers(int(low), int(high))
        if integer
        else st.one_of(st.floats(low, high), st.integers(int(math.ceil(low)), int(high)))
    )
    return _rarely(
        st.one_of(st.sampled_from([low, high]), inside),
        st.sampled_from([lo - 1, hi + 1, "1", True]),
    )


def values(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of what `node` admits, its edges included, and now and then a bad one."""
    kind = node.get("type")
    if "enum" in node:
        base: st.SearchStrategy[Any] = _rarely(st.sampled_from(node["enum"]), st.just("bogus"))
    elif kind == "object" and "properties" in node:
        required = node.get("required", [])
        base = st.fixed_dictionaries(
            {k: values(v) for k, v in node["properties"].items() if k in required},
            optional={k: values(v) for k, v in node["properties"].items() if k not in required},
        )
    elif kind == "object":
        base = st.sampled_from([{}, {"requests": {"cpu": "2"}}])
    elif kind == "array":
        size = node.get("minItems", 1)
        base = _rarely(
            st.lists(values(node["items"]), min_size=size, max_size=node.get("maxItems", 3)),
            st.lists(values(node["items"]), max_size=size + 1),
        )
    elif kind in ("integer", "number"):
        base = _numbers(node, kind == "integer")
    elif kind == "boolean":
        base = _rarely(st.booleans(), st.just(1))
    elif "pattern" in node:
        base = _rarely(st.sampled_from(["math", "exact", "pkg.mod:score"]), st.just("no good"))
    else:
        base = _rarely(st.sampled_from(["x", "/models/base", "</think>"]), st.just(""))
    return st.one_of(base, st.none()) if node.get("nullable") else base


@settings(
    max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(spec=values(SPEC))
def test_crd_admits_every_spec_the_spec_accepts(spec: dict[str, Any]) -> None:
    run = {**MINIMAL, "spec": spec}
    try:
        parsed = parse_run(run)
    except SpecError:
        return  # the CRD may reject it or leave it to the operator: either is fine
    stored, errors = admit(SCHEMA, run)
    assert errors == [], f"valid per scalerl.spec, refused by the CRD: {errors}"
    assert parse_run(stored) == parsed, "the CRD's defaults changed the meaning of the spec"


@needs_cel
def test_cel_rule_checker_sees_failures() -> None:
    # Guards the property test against a checker that never fails.
    spec = {**MINIMAL["spec"], "model": {"path": "/m", "thinkEnd": None}}
    assert cel_errors(SPEC, apply_defaults(SPEC, spec))
