"""What the real API server admits for our CRD, as `kubectl apply` meets it: every spec that
scalerl.spec accepts, with the same defaults; and its CEL rules refuse what the spec's validators
refuse, with the messages a user reads. Creations are server-side dry runs (nothing is stored);
an update is tried against a run that was really created."""

from __future__ import annotations

import copy
import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runs import ensure_crd

from scalerl.errors import SpecError
from scalerl.operator import crd as crd_builder
from scalerl.spec import RunSpec, parse_run

ROOT = Path(__file__).resolve().parents[2]
SPEC = crd_builder.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
    "spec"
]
MINIMAL = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "math-8b"},
    "spec": {"model": {"path": "/models/base"}, "data": {"train": "/data/train.jsonl"}},
}


class Server:
    """Create, or change, a run in one namespace; what the server answered."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.runs = f"/apis/scalerl.dev/v1alpha1/namespaces/{namespace}/scalerlruns"

    def create(self, run: dict[str, Any], *, dry_run: bool = True) -> tuple[int, Any]:
        query = "?dryRun=All" if dry_run else ""
        return self.plane.api("POST", self.runs + query, run)

    def rejected(self, run: dict[str, Any], old: dict[str, Any] | None = None) -> str:
        """The server's message refusing `run` (created, or replacing `old`); "" if admitted."""
        if old is None:
            code, body = self.create(run)
        else:
            name = f"r-{uuid.uuid4().hex[:8]}"
            old, run = _named(old, name), _named(run, name)
            code, stored = self.create(old, dry_run=False)
            assert code == 201, stored
            run["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            code, body = self.plane.api("PUT", f"{self.runs}/{name}?dryRun=All", run)
        return "" if code in (200, 201) else str(body.get("message", body))


def _named(run: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(run)
    out["metadata"]["name"] = name
    return out


@pytest.fixture(scope="module")
def server(plane: ControlPlane) -> Iterator[Server]:
    ensure_crd(plane)
    yield Server(plane, plane.namespace(f"crd-{uuid.uuid4().hex[:8]}"))


def with_spec(**spec: Any) -> dict[str, Any]:
    run = copy.deepcopy(MINIMAL)
    run["spec"].update(spec)
    return run


@pytest.mark.parametrize(
    "example", ["run.yaml", "local.yaml", "colocated.yaml", "lora.yaml", "tiny-cluster.yaml"]
)
def test_examples_are_admitted(server: Server, example: str) -> None:
    assert server.rejected(yaml.safe_load((ROOT / "examples" / example).read_text())) == ""


def test_the_server_fills_a_minimal_spec_as_pydantic_does(server: Server) -> None:
    code, stored = server.create(copy.deepcopy(MINIMAL))
    assert code == 201, stored
    parsed = RunSpec.model_validate(MINIMAL["spec"]).model_dump(by_alias=True, mode="json")
    assert stored["spec"] == _without_nulls(parsed)


def test_data_as_a_list_of_sources_is_stored_as_written(server: Server) -> None:
    # A structural schema has no "string or array": data.train and validation.path keep any
    # value, and scalerl.spec checks it when the operator parses the run.
    sources = [
        {"path": "/data/math.jsonl", "reward": "math"},
        {"path": "/data/code.jsonl", "reward": "code", "domain": "python"},
    ]
    data = {"train": sources, "validation": {"path": sources[:1], "prompts": 10}}
    run = with_spec(model={"path": "/models/base"}, data=data)
    code, stored = server.create(run)
    assert code == 201, stored
    assert stored["spec"]["data"]["train"] == sources
    assert stored["spec"]["data"]["validation"]["path"] == sources[:1]
    assert parse_run(stored).spec == parse_run(run).spec


def _without_nulls(value: Any) -> Any:
    """Absent and null mean the same; pydantic dumps empty free maps the CRD leaves absent."""
    if isinstance(value, dict):
        kept = {k: _without_nulls(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in kept.items() if v != {} or k not in ("resources",)}
    return value


# --- CEL rules: the cross-field validators of scalerl.spec and immutability -------------------


def test_interruption_of_a_model_that_does_not_think_is_refused(server: Server) -> None:
    run = with_spec(model={"path": "/m", "thinkEnd": None})
    assert "thinkEnd is null" in server.rejected(run)
    run["spec"]["recipe"] = {"length": {"interruption": {"enabled": False}}}
    assert server.rejected(run) == ""


def test_a_window_outside_the_thinking_budget_is_refused(server: Server) -> None:
    length = {"thinkingBudget": 100, "interruption": {"window": [50, 200]}}
    assert "interruption.window must satisfy" in server.rejected(
        with_spec(recipe={"length": length})
    )
    length["interruption"]["window"] = [50, 100]
    assert server.rejected(with_spec(recipe={"length": length})) == ""


def test_loss_parameters_belong_to_their_loss(server: Server) -> None:
    said = server.rejected(with_spec(recipe={"loss": {"type": "dapo", "epsilonMax": 4.0}}))
    assert "epsilonMax applies only to type cispo" in said
    assert server.rejected(with_spec(recipe={"loss": {"type": "gspo", "epsilonLow": 0.003}})) == ""


@pytest.mark.parametrize(
    "edit",
    [
        {"model": {"path": "/models/other"}},
        {"recipe": {"batch": {"prompts": 8}}},
        {"seed": 7},
        {"checkpoint": {"claimName": "elsewhere"}},
    ],
)
def test_what_defines_the_experiment_is_immutable(server: Server, edit: dict[str, Any]) -> None:
    old = with_spec(checkpoint={"claimName": "ckpt"})
    new = copy.deepcopy(old)
    new["spec"].update(edit)
    assert "immutable" in server.rejected(new, old)


def test_a_colocated_run_is_one_process(server: Server) -> None:
    # The defaults (8 generators, 2 trainer ranks, 8 GPUs each) are a disaggregated run's.
    assert "placement colocated runs one process" in server.rejected(
        with_spec(placement="colocated")
    )

    def one(gpus: int) -> dict[str, int]:
        return {"replicas": 1, "gpus": gpus}

    ok = with_spec(placement="colocated", trainers=one(1), generators=one(1))
    assert server.rejected(ok) == ""
    assert server.rejected(with_spec(placement="colocated", trainers=one(0), generators=one(1)))


def test_the_placement_of_a_run_is_immutable(server: Server) -> None:
    one = {"replicas": 1, "gpus": 1}
    new = with_spec(placement="colocated", trainers=one, generators=dict(one))
    assert "placement is immutable" in server.rejected(new, with_spec())


def test_budget_suspend_and_generators_may_change(server: Server) -> None:
    new = with_spec(budget={"maxSteps": 20000}, suspend=True, generators={"replicas": 4})
    assert server.rejected(new, with_spec()) == ""


def test_run_names_are_limited_to_what_child_names_allow(server: Server) -> None:
    run = with_spec()
    run["metadata"]["name"] = "7-" + "x" * 10
    assert "metadata.name" in server.rejected(run)
    run["metadata"]["name"] = "a" * 48
    assert "metadata.name" in server.rejected(run)


# --- property: whatever scalerl.spec accepts, the server accepts (and defaults the same) ------


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
    elif kind == "object" and "additionalProperties" in node:  # a map of label keys
        keys = st.sampled_from(["gpu", "example.com/pool", "no good key"])
        base = st.dictionaries(keys, values(node["additionalProperties"]), max_size=2)
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
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(spec=values(SPEC))
def test_the_server_admits_every_spec_the_spec_accepts(
    server: Server, spec: dict[str, Any]
) -> None:
    run = {**MINIMAL, "spec": spec}
    try:
        parsed = parse_run(run)
    except SpecError:
        return  # the server may refuse it or leave it to the operator: either is fine
    code, stored = server.create(json.loads(json.dumps(run)))
    assert code == 201, f"valid per scalerl.spec, refused by the server: {stored.get('message')}"
    assert parse_run(stored).spec == parsed.spec, "the server's defaults changed the spec"
