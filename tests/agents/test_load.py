"""Loading spec.environment.verifiers (scalerl.agents.load): a load_environment that exits or
fails is a clear DataError, and the secrets among its arguments reach neither that error nor any
log line, verifiers' own included (it logs the arguments it is given)."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scalerl.agents.load import load_environment
from scalerl.errors import DataError
from scalerl.spec import parse_run

SECRETS = {
    "api_key": "sk-SECRET-123",
    "judge_password": "correct horse battery staple",
    "endpoint": "https://judge:hunter22@judge.example/v1?token=tok-998877",
    "note": "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3",  # a Hugging Face token under a plain name
}
SHOWN = ["sk-SECRET-123", "correct horse", "hunter22", "tok-998877", "hf_a1B2c3"]

MODULES = {
    "exit_env": """
        import sys

        def load_environment(**kwargs):
            sys.exit(3)
    """,
    "raising_env": """
        import os

        def load_environment(**kwargs):
            return os.environ["HF_DATASET_TOKEN_NOT_SET"]
    """,
    "echoing_env": """
        def load_environment(api_key="", **kwargs):
            raise ValueError(f"the judge refused key {api_key}")
    """,
    "keyed_env": """
        import verifiers as vf
        from datasets import Dataset

        def load_environment(api_key="", judge_password="", endpoint="", note=""):
            data = Dataset.from_list([{"question": "say 1", "answer": "1"}])
            return vf.SingleTurnEnv(
                dataset=data, eval_dataset=data,
                rubric=vf.Rubric(funcs=[lambda completion, answer: 1.0]),
            )
    """,
}


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[None]:
    """The environment modules above on the path, as installed packages would be."""
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    yield
    sys.path.remove(str(tmp_path))
    for name in MODULES:
        sys.modules.pop(name, None)


def spec(env_id: str, args: dict[str, Any]) -> Any:
    return parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "agent"},
            "spec": {
                "model": {"path": "/nowhere"},
                "environment": {"verifiers": {"id": env_id, "args": args}},
            },
        }
    ).spec


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return caplog.text + "\n".join(r.getMessage() for r in caplog.records)


def test_an_environment_that_calls_sys_exit_is_a_clear_error(installed: None) -> None:
    with pytest.raises(DataError, match=r"'exit-env' failed to load: its load_environment called "):
        load_environment(spec("exit-env", {}))


@pytest.mark.parametrize("env_id", ["raising-env", "echoing-env"])
def test_a_failed_load_names_the_problem_and_no_secret(
    installed: None, env_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(DataError) as err:
        load_environment(spec(env_id, SECRETS))
    said = str(err.value)
    assert f"spec.environment.verifiers: {env_id!r} failed to load" in said
    assert "HF_DATASET_TOKEN_NOT_SET" in said or "the judge refused key ***" in said
    logged = _logged(caplog)
    assert "Failed to load environment" in logged  # verifiers' own line is kept, masked
    for secret in SHOWN:
        assert secret not in said and secret not in logged


def test_a_loaded_environment_logs_its_arguments_masked(
    installed: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    env = load_environment(spec("keyed-env", SECRETS))
    assert env.env_args == SECRETS  # the environment itself gets the real values
    logged = _logged(caplog)
    assert "Using provided args" in logged and "api_key=***" in logged
    for secret in SHOWN:
        assert secret not in logged
    # Once loaded, logging is as it was: nothing masks a later line.
    logging.getLogger("scalerl.test").warning("api_key=%s", "sk-later-1234")
    assert "api_key=sk-later-1234" in caplog.records[-1].getMessage()
