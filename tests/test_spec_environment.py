"""spec.environment: a verifiers package or an OpenEnv server instead of data.train + reward."""

from __future__ import annotations

from typing import Any

import pytest

from scalerl.errors import SpecError
from scalerl.spec import parse_run


def run(spec: dict[str, Any]) -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "agent"},
            "spec": {"model": {"path": "builtin:tool-arith"}, **spec},
        }
    ).spec


def test_a_verifiers_environment_needs_no_data() -> None:
    spec = run({"environment": {"verifiers": {"id": "tool-arith", "args": {"num_train": 64}}}})
    assert spec.environment.verifiers.args == {"num_train": 64}
    assert spec.data.train is None and spec.data.train_sources() == []
    assert spec.environment.pass_threshold == 0.5 and spec.environment.max_turns == 8


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({}, "spec.data.train: required (or give spec.environment)"),
        (
            {"environment": {"verifiers": {"id": "x"}}, "data": {"train": "t.jsonl"}},
            "spec.data.train: must be absent with environment.verifiers",
        ),
        (
            {"environment": {"openenv": {"url": "http://127.0.0.1:8000"}}},
            "spec.data.train: required with environment.openenv",
        ),
        ({"environment": {}}, "set exactly one of verifiers and openenv"),
        ({"environment": {"openenv": {"port": 80}}}, "set app (local), image (cluster) or url"),
        ({"environment": {"verifiers": {"id": "x"}, "maxTurns": 0}}, "maxTurns"),
        ({"environment": {"verifiers": {"id": "x"}, "toolTimeoutSeconds": 0}}, "toolTimeout"),
    ],
)
def test_a_bad_environment_is_named(spec: dict[str, Any], complaint: str) -> None:
    with pytest.raises(SpecError, match="spec") as caught:
        run(spec)
    assert complaint in str(caught.value)
