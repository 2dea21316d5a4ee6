"""spec.data for code: `reward: code` and the sandbox's limits (spec.data.code), with their
defaults and every bad value named by its path."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import SpecError
from scalerl.spec import parse_run

RUN = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "code-run"},
    "spec": {
        "model": {"path": "/models/base"},
        "data": {"train": "/data/code.jsonl", "reward": "code"},
    },
}


def _with_code(**code: object) -> dict:
    run = copy.deepcopy(RUN)
    run["spec"]["data"]["code"] = code
    return run


def test_reward_code_is_accepted_with_the_default_limits() -> None:
    data = parse_run(RUN).spec.data
    assert data.reward == "code"
    assert (data.code.test_timeout_seconds, data.code.problem_timeout_seconds) == (6.0, 60.0)
    assert (data.code.memory_mib, data.code.processes, data.code.output_mib) == (1024, 32, 16)
    assert data.code.workers == 0  # one per CPU


def test_limits_are_read_in_camel_case() -> None:
    code = parse_run(_with_code(testTimeoutSeconds=2.5, workers=4, memoryMiB=512)).spec.data.code
    assert (code.test_timeout_seconds, code.workers, code.memory_mib) == (2.5, 4, 512)


@given(
    st.sampled_from(["testTimeoutSeconds", "problemTimeoutSeconds"]),
    st.one_of(st.floats(max_value=0), st.just(True), st.just("6")),
)
def test_bad_timeouts_are_named_by_their_path(field: str, value: object) -> None:
    with pytest.raises(SpecError) as info:
        parse_run(_with_code(**{field: value}))
    assert any(p.startswith(f"spec.data.code.{field}:") for p in info.value.problems)


def test_bad_limits_and_unknown_fields_are_named() -> None:
    with pytest.raises(SpecError) as info:
        parse_run(_with_code(memoryMiB=1, processes=0, network=True))
    found = "\n".join(info.value.problems)
    assert "spec.data.code.memoryMiB:" in found and "spec.data.code.processes:" in found
    assert "spec.data.code.network:" in found
