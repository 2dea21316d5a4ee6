"""Loading the run's environment and reading its prompts.

A verifiers environment is loaded with verifiers' own `load_environment(id, **args)`, as prime-rl
does, so a user's package runs unchanged. Its dataset gives the training prompts, its eval split
(or spec.data.validation.path) the held-out ones. Every failure is a DataError naming the spec
field: a package that is not installed, arguments its `load_environment` does not take, a
dataset it cannot build, no eval split, a `load_environment` that calls `sys.exit`. Secrets among
the arguments (`scalerl.redact`) are masked in the error and in what verifiers logs of them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
from collections.abc import Iterator, Mapping
from typing import Any

from scalerl.errors import DataError
from scalerl.generator.prompts import Example, load_sources
from scalerl.redact import redact_text, redacted_logs, secrets_of
from scalerl.spec import RunSpec

FIELD = "spec.environment.verifiers"


def load_environment(spec: RunSpec) -> Any:
    """The run's spec.environment (a `verifiers.Environment`), its tools and messages contained
    (`scalerl.agents.containment`)."""
    from scalerl.agents.containment import contain

    environment = spec.environment
    if environment is None:
        raise DataError("spec.environment: not set")
    with _signals_kept():
        if environment.verifiers is not None:
            env = _verifiers(environment.verifiers.id, environment.verifiers.args)
        else:
            from scalerl.agents.openenv import load_openenv

            env = load_openenv(spec)
    contain(env, environment)
    return env


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """verifiers' Environment installs SIGINT and SIGTERM handlers of its own when it is built
    (exiting the process from inside the handler), which would take over the generator's orderly
    shutdown, and fails outright off the main thread (a colocated process builds its generator
    on a thread). While the environment is built, installing a handler does nothing."""
    install = signal.signal
    signal.signal = lambda number, handler: signal.getsignal(number)  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = install


def _verifiers(env_id: str, args: Mapping[str, Any]) -> Any:
    import verifiers as vf
    from verifiers.utils.env_utils import env_module_name

    module = env_module_name(env_id)
    if importlib.util.find_spec(module) is None:
        raise DataError(
            f"{FIELD}.id: no installed package provides {env_id!r} (module {module!r}); install "
            "the environment's package where the generators run (README: Agents and tools)"
        )
    secrets = secrets_of(dict(args))
    try:
        # verifiers logs the arguments it is given (at INFO, and at ERROR on a failure): their
        # secrets are masked in every log line made while it loads.
        with redacted_logs(secrets):
            env = vf.load_environment(env_id, **args)
    except (ValueError, RuntimeError) as err:
        cause = err.__cause__ or err
        where = f"{FIELD}.args" if isinstance(cause, TypeError) else FIELD
        said = redact_text(str(cause), secrets)
        raise DataError(f"{where}: {env_id!r} failed to load: {said}") from None
    except SystemExit as err:  # its load_environment called sys.exit: not the generator's exit
        raise DataError(
            f"{FIELD}: {env_id!r} failed to load: its load_environment called sys.exit"
            f"({err.code!r}) instead of raising an error"
        ) from None
    if not isinstance(env, vf.Environment):
        raise DataError(
            f"{FIELD}.id: {env_id!r}'s load_environment returned {type(env).__name__}, not a "
            "verifiers Environment (scalerl takes the classic API of verifiers 0.3.1)"
        )
    return env


def environment_examples(env: Any, spec: RunSpec) -> tuple[list[Example], list[Example]]:
    """(training prompts, held-out prompts) of the environment: its dataset and its eval split,
    or spec.data.validation.path where given; at most spec.data.validation.prompts held out."""
    name = _name(env, spec)
    try:
        train_rows = env.get_dataset() if _has(env, "dataset") else None
        eval_rows = env.get_eval_dataset() if _has(env, "eval_dataset") else None
    except Exception as err:  # the environment's own dataset code
        raise DataError(f"{FIELD}: {name!r} could not build its dataset: {err}") from err
    if train_rows is None or len(train_rows) == 0:
        raise DataError(f"{FIELD}: {name!r} has no training dataset (its `dataset` is empty)")
    train = [_example(name, "train", i, row) for i, row in enumerate(train_rows)]
    wanted = spec.data.validation.prompts
    if spec.data.validation.path is not None:
        held = [e for rows in load_sources(spec.data.held_out(), spec.data) for e in rows]
        return train, [_as_input(e) for e in held[:wanted]]
    if eval_rows is None or len(eval_rows) == 0:
        raise DataError(
            f"{FIELD}: {name!r} has no eval split (eval_dataset), and the fit needs held-out "
            "prompts: give the environment one or set spec.data.validation.path"
        )
    held = [_example(name, "eval", i, row) for i, row in enumerate(eval_rows)]
    return train, held[:wanted]


def _has(env: Any, which: str) -> bool:
    return (
        getattr(env, which, None) is not None or getattr(env, f"{which}_source", None) is not None
    )


def _name(env: Any, spec: RunSpec) -> str:
    environment = spec.environment
    if environment is not None and environment.verifiers is not None:
        return environment.verifiers.id
    return str(getattr(env, "env_id", "") or "environment")


def _example(name: str, split: str, index: int, row: Mapping[str, Any]) -> Example:
    inputs = dict(row)
    example_id = inputs.get("example_id", index)
    return Example(
        id=f"{split}-{example_id}",
        prompt=_last_user_text(inputs.get("prompt")),
        answer=str(inputs.get("answer") or ""),
        source=f"environment {name}: {split} row {index}",
        inputs=inputs,
    )


def _as_input(example: Example) -> Example:
    """A row of spec.data.validation.path as the environment's input: the prompt as the user's
    message, the answer as the environment's `answer`."""
    inputs = {"prompt": [{"role": "user", "content": example.prompt}], "answer": example.answer}
    return Example(example.id, example.prompt, example.answer, example.source, inputs=inputs)


def _last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt or []):
        role = message.get("role") if isinstance(message, dict) else getattr(message, "role", "")
        if role == "user":
            content = message.get("content") if isinstance(message, dict) else message.content
            return content if isinstance(content, str) else str(content)
    return ""
