"""Checks made before any process of a run starts (`scalerl validate --deep`, `scalerl run`).

Everything a run needs from the user's model folder and data is checked here, once, with one line
per problem naming the field to change: the model loads (config and tokenizer), it has an EOS,
`thinkEnd` is one token when set, a chat template exists when asked for, the data files have the
fields and enough rows, the reward resolves (`reward: code`: its sandbox can be made here), and
the longest tokenized prompt plus the budgets fits the model's context. The generators make the
model and context checks with the same functions (`model_dir_problem`, `context_problem`) and
compute their engine's `max_model_len` with `model_len_needed`, so what was checked is what runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalerl.errors import InputError, PeerError, SandboxUnavailable, SpecError
from scalerl.generator.prompts import NO_CHAT_TEMPLATE
from scalerl.spec import RunSpec, ScaleRLRun

# config.json keys that hold a model's context length, in the order transformers models use them.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def check(run: ScaleRLRun) -> None:
    """Raise SpecError listing every problem found (nothing is started by the caller then)."""
    problems = problems_of(run)
    if problems:
        raise SpecError(problems)


def problems_of(run: ScaleRLRun) -> list[str]:
    spec = run.spec
    problems: list[str] = []
    tokenizer = _tokenizer(spec, problems)
    if spec.environment is not None:
        _environment(spec, tokenizer, problems)
        return problems
    examples = _examples(spec, problems)
    _rewards(spec, examples, problems)
    if examples is not None:
        _code_tests([e for e in examples if e.reward == "code"], problems)
    if tokenizer is not None:
        _tokens(spec, tokenizer, problems)
        if examples is not None:
            _lengths(spec, tokenizer, examples, problems)
    return problems


def model_limit(model_path: str | Path) -> int | None:
    """The model's context length from its config.json (None when it does not say)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_len_needed(spec: RunSpec, tokenizer: Any, longest_prompt: int) -> int:
    """Tokens one sequence can reach: the longest prompt, the completion budgets, and the
    interruption phrase when it can be injected (it comes on top of the thinking)."""
    phrase = 0
    if spec.thinks and spec.recipe.length.interruption.enabled:
        phrase = len(tokenizer.encode(spec.interruption_phrase, add_special_tokens=False))
    return longest_prompt + spec.max_completion_tokens + phrase


def model_dir_problem(model_path: str | Path) -> str | None:
    """Why `spec.model.path` is not a Hugging Face model directory, or None when it is one."""
    path = Path(model_path)
    if (path / "config.json").is_file():
        return None
    what = "does not exist" if not path.exists() else "has no config.json"
    return f"spec.model.path: {path} {what}; it must be a Hugging Face model directory"


def context_problem(spec: RunSpec, tokenizer: Any, longest_prompt: int) -> str | None:
    """Why the longest prompt and the budgets do not fit the model's context, or None."""
    needed = model_len_needed(spec, tokenizer, longest_prompt)
    limit = model_limit(spec.model.path)
    if limit is None or needed <= limit:
        return None
    return (
        f"spec.recipe.length: the longest prompt ({longest_prompt} tokens) plus the completion "
        f"budget ({_budget(spec)}) needs {needed} tokens, over the model's "
        f"max_position_embeddings {limit}; lower the budgets"
    )


def _tokenizer(spec: RunSpec, problems: list[str]) -> Any:
    path = Path(spec.model.path)
    problem = model_dir_problem(path)
    if problem is not None:
        problems.append(problem)
        return None
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as err:
        problems.append(f"spec.model.path: {path}/config.json does not load: {_first_line(err)}")
        return None
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, KeyError, TypeError) as err:
        problems.append(f"spec.model.path: {path} has no loadable tokenizer: {_first_line(err)}")
        return None


def _examples(spec: RunSpec, problems: list[str]) -> list[Any] | None:
    from scalerl.generator.prompts import train_and_validation

    missing = _missing_files(spec)
    if missing:
        problems += missing
        return None
    try:
        train, validation = train_and_validation(spec.data, spec.seed)
    except InputError as err:
        problems.append(f"spec.data: {err}")
        return None
    if len(train) < spec.generators.replicas:
        problems.append(
            f"spec.data.train: {len(train)} training prompts cannot be shared by "
            f"{spec.generators.replicas} generators (spec.generators.replicas)"
        )
    return train + validation


def _missing_files(spec: RunSpec) -> list[str]:
    """A line for each data file (each source of a list) that does not exist."""
    missing = []
    for field, value, sources in (
        ("spec.data.train", spec.data.train, spec.data.train_sources()),
        ("spec.data.validation.path", spec.data.validation.path, spec.data.held_out()),
    ):
        for i, source in enumerate(sources):
            where = field if isinstance(value, str) else f"{field}.{i}.path"
            if not Path(source.path).is_file():
                missing.append(f"{where}: {source.path} does not exist")
    return missing


def _rewards(spec: RunSpec, examples: list[Any] | None, problems: list[str]) -> None:
    """Every reward the run scores by resolves: the spec's, its sources', and any a row names
    (the first row naming it is told)."""
    from scalerl.generator.rewards import load_reward

    named = {name: "spec.data.reward" for name in spec.data.rewards()}
    for example in examples or []:
        named.setdefault(example.reward, f"{example.source}: field 'reward'")
    for name, where in named.items():
        try:
            load_reward(name)
        except InputError as err:
            problems.append(f"{where}: {err}")
    if "code" in named:
        _sandbox(spec, named["code"], problems)


def _sandbox(spec: RunSpec, where: str, problems: list[str]) -> None:
    """A run that scores model-written code can make its sandbox here, or allows plain
    processes by name: tried before any process starts, so such a run never starts to fail."""
    from scalerl.sandbox import required

    try:
        required(spec.data.code.unsafe_allow_plain)
    except SandboxUnavailable as err:
        problems.append(f"{where}: code: {err}")


def _environment(spec: RunSpec, tokenizer: Any, problems: list[str]) -> None:
    """spec.environment loads, has training and held-out prompts, and its first contexts (the
    prompt's messages and the tools, in the model's chat template) fit the model."""
    from scalerl.agents.load import environment_examples, load_environment
    from scalerl.agents.rollouts import first_context

    try:
        with _openenv_server(spec):
            env = load_environment(spec)
        examples = environment_examples(env, spec)
    except (InputError, PeerError) as err:  # PeerError: an openenv.app that did not come up
        problems.append(str(err))
        return
    if tokenizer is None:
        return
    _tokens(spec, tokenizer, problems)
    if not getattr(tokenizer, "chat_template", None):
        problems.append(
            f"spec.model.path: the tokenizer at {spec.model.path} has no chat template; an "
            "environment's conversation is rendered with it"
        )
        return
    try:
        longest = max(len(first_context(env, tokenizer, e)) for e in examples[0] + examples[1])
    except (ValueError, TypeError, KeyError) as err:  # a template that fails on these messages
        problems.append(f"spec.model.path: the chat template fails on a prompt: {_first_line(err)}")
        return
    problem = context_problem(spec, tokenizer, longest)
    if problem is not None:
        problems.append(problem)


@contextlib.contextmanager
def _openenv_server(spec: RunSpec) -> Iterator[None]:
    """spec.environment.openenv.app started on 127.0.0.1 for the check (as `scalerl run` will
    start it for the run) where no server is named; nothing otherwise."""
    from scalerl.agents.openenv_server import URL_VARIABLE, LocalServer

    openenv = spec.environment.openenv if spec.environment else None
    if openenv is None or openenv.app is None or openenv.url or os.environ.get(URL_VARIABLE):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="scalerl-check-") as scratch:
        server = LocalServer.start(openenv.app, Path(scratch) / "openenv.log")
        os.environ[URL_VARIABLE] = server.url
        try:
            yield
        finally:
            del os.environ[URL_VARIABLE]
            server.stop()


def _code_tests(examples: list[Any], problems: list[str], shown: int = 5) -> None:
    """With `reward: code`, every row's reference must hold tests (scalerl.generator.code_reward)
    — a bad one found mid-run would stop the run; the first `shown` are named, and the count."""
    from scalerl.generator.code_reward import parse_tests

    bad = []
    for example in examples:
        try:
            parse_tests(example.answer)
        except InputError as err:
            bad.append(f"{example.source or example.id}: {err}")
    for line in bad[:shown]:
        problems.append(f"spec.data.answerField: {line}")
    if len(bad) > shown:
        problems.append(f"spec.data.answerField: {len(bad) - shown} more rows without code tests")


def _tokens(spec: RunSpec, tokenizer: Any, problems: list[str]) -> None:
    from scalerl.generator.tokens import eos_ids, think_end_id

    for check in (
        lambda: eos_ids(spec.model.path, tokenizer),
        lambda: think_end_id(tokenizer, spec.model.think_end),
    ):
        try:
            check()
        except InputError as err:
            problems.append(str(err) if str(err).startswith("spec.") else f"spec.model: {err}")
    if _template_missing(spec, tokenizer):
        problems.append(NO_CHAT_TEMPLATE.format(where=f" at {spec.model.path}"))


def _template_missing(spec: RunSpec, tokenizer: Any) -> bool:
    return spec.data.chat_template and not getattr(tokenizer, "chat_template", None)


def _lengths(spec: RunSpec, tokenizer: Any, examples: list[Any], problems: list[str]) -> None:
    from scalerl.generator.prompts import PromptEncoder, empty_prompt_problem

    if _template_missing(spec, tokenizer):
        return  # said once by _tokens: without the template no prompt can be formatted
    length = spec.recipe.length
    encoder = PromptEncoder.for_data(tokenizer, spec.data, length.max_prompt_tokens)
    try:
        sizes = [len(ids) for ids in encoder.batch_ids([e.prompt for e in examples])]
    except (ValueError, TypeError, KeyError) as err:  # a chat template that fails to render
        problems.append(f"spec.data.chatTemplate: formatting a prompt failed: {_first_line(err)}")
        return
    empty = empty_prompt_problem(examples, sizes)
    if empty is not None:
        problems.append(f"spec.data: {empty}")
    longest = max(sizes, default=0)
    over = sum(size > length.max_prompt_tokens for size in sizes)
    if over:
        problems.append(
            f"spec.recipe.length.maxPromptTokens: {over} of {len(sizes)} prompts are longer than "
            f"{length.max_prompt_tokens} tokens (longest {longest}); raise it or shorten them"
        )
    problem = context_problem(spec, tokenizer, longest)
    if problem is not None:
        problems.append(problem)


def _budget(spec: RunSpec) -> str:
    length = spec.recipe.length
    if not spec.thinks:
        return f"answerBudget {length.answer_budget}"
    phrase = " + interruption phrase" if length.interruption.enabled else ""
    return f"thinkingBudget {length.thinking_budget} + answerBudget {length.answer_budget}{phrase}"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
