"""The prompts: training and held-out files or Hub datasets, their rewards and domains, and the
sandbox limits of `reward: code`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from scalerl.spec.base import HUB_PREFIX, Bool, Float, Int, _at, _Model

_REWARD = re.compile(r"^(math|exact|code|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")


# (status.evaluations and status.prediction must stay small). A domain is a label value and a
# key in status: a short lowercase name.
MAX_DOMAINS = 8
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,30}[a-z0-9])?$")


def domain_problem(name: str) -> str | None:
    """Why `name` cannot be a domain, or None."""
    if _DOMAIN.match(name):
        return None
    return (
        f"{name!r} is not a domain name (1-32 of a-z, 0-9, '_', '.', '-', starting and ending "
        "with a letter or digit)"
    )


def reward_problem(name: str) -> str | None:
    """Why `name` cannot be a reward, or None."""
    if _REWARD.match(name):
        return None
    return f"{name!r} is not one of math, exact, code, or module:function"


def default_domain(reward: str) -> str:
    """A row's domain when it names none: its reward's name (a module:function reward: its
    function's name, lowercased, so it stays a domain name)."""
    name = reward.rpartition(":")[2].rpartition(".")[2].lower()
    return name if _DOMAIN.match(name) else "custom"


class DataSource(_Model):
    """One data file of a run whose data is a list of files, with the reward its rows are scored
    by (and the domain their pass rate and curve are reported under)."""

    path: str = Field(
        min_length=1,
        description="A JSONL or Parquet file (or a builtin: name), or a Hub dataset id "
        "hf://datasets/org/name[@revision][/path] (hf://org/name also reads as a dataset).",
    )
    split: str | None = Field(
        None,
        min_length=1,
        description="For a Hub dataset: the split whose files are read (train-*.parquet, "
        "data/train.jsonl, ...); null: train for data.train, validation (else test) for "
        "data.validation.path.",
    )
    data_files: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="For a Hub dataset: globs of the repo's files to read (JSONL or Parquet), "
        "instead of a split's.",
    )
    reward: str | None = Field(
        None,
        description="The reward of this file's rows (a row's own `reward` field wins); "
        "null: spec.data.reward.",
    )
    domain: str | None = Field(
        None,
        description="The domain this file's rows are reported under (a row's own `domain` "
        "field wins); null: the reward's name.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_name(cls, value: str | None) -> str | None:
        problem = None if value is None else reward_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("domain")
    @classmethod
    def _domain_name(cls, value: str | None) -> str | None:
        problem = None if value is None else domain_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _hub_selection(self) -> DataSource:
        if (self.split or self.data_files) and not self.path.startswith(HUB_PREFIX):
            raise ValueError("split and dataFiles select the files of a Hub dataset (hf://)")
        return self


# data.train and data.validation.path: one file, or a list of files each with its reward. Told
# apart by the value's type, so a bad one gets one message about the form it has (the tags are
# dropped from the field's path in messages).
_FILE, _SOURCES = "<file>", "<sources>"


def _file_or_sources(value: Any) -> str | None:
    if isinstance(value, str):
        return _FILE
    return _SOURCES if isinstance(value, list | tuple) else None


Sources = Annotated[
    Annotated[str, Tag(_FILE), Field(min_length=1)]
    | Annotated[list[DataSource], Tag(_SOURCES), Field(min_length=1, max_length=64)],
    Discriminator(
        _file_or_sources,
        custom_error_type="file_or_sources",
        custom_error_message="must be a file (JSONL or Parquet) or a list of sources, each "
        "{path, reward, domain}",
    ),
]


class ValidationSpec(_Model):
    """The held-out prompts every evaluation scores: the points the law is fitted to."""

    path: Sources | None = Field(
        None,
        description="Held-out prompts (JSONL or Parquet, or a Hub dataset hf://datasets/...: "
        "its validation, else test, split), or a list of sources ({path, reward, domain, split, "
        "dataFiles}: `prompts` is shared evenly among their files); when unset, held out from "
        "train.",
    )
    prompts: Int = Field(
        1000, ge=1, le=10_000_000, description="Number of held-out prompts; paper: 1,000."
    )


class CodeSpec(_Model):
    """How `reward: code` runs a completion's program against its tests (scalerl.sandbox)."""

    test_timeout_seconds: Float = Field(
        6.0, gt=0, le=3600, description="Wall and CPU time of one test case."
    )
    problem_timeout_seconds: Float = Field(
        60.0,
        gt=0,
        le=36_000,
        description="Wall time of all of one completion's tests together; tests left when it "
        "runs out fail as timeouts.",
    )
    memory_mib: Int = Field(
        1024,
        ge=64,
        le=1 << 20,
        alias="memoryMiB",
        description="Address-space limit of a test's process, MiB.",
    )
    processes: Int = Field(
        32, ge=1, le=4096, description="Processes (and threads) a test may run at once."
    )
    output_mib: Int = Field(
        16,
        ge=1,
        le=4096,
        alias="outputMiB",
        description="Output a test may print (or write) before it is killed, MiB.",
    )
    workers: Int = Field(
        0,
        ge=0,
        le=4096,
        description="Tests run at once by a generator; 0: one per CPU the process may use.",
    )
    unmasked_proc: Bool = Field(
        False,
        description="On a cluster, the pods that run these programs (the generators, or a "
        "colocated run's pods, and the sandbox check before them) get a user namespace of their "
        "own and an unmasked /proc (hostUsers: false, procMount: Unmasked): the sandbox then "
        "gives its programs a /proc of their own, for programs that read one (/proc/self); "
        "under the masked /proc of a default pod they see none, sandboxed alike. Needs a "
        "namespace at the baseline Pod Security level (restricted refuses procMount: Unmasked) "
        "and nodes that run user-namespaced pods.",
    )
    unsafe_allow_plain: Bool = Field(
        False,
        description="UNSAFE. Where no sandbox can be made (no bubblewrap, or user namespaces "
        "refused), run model-written programs as plain processes of the generator's user: they "
        "can read its environment and files, reach the network and signal its processes. "
        "False (default): such a run fails before it starts (SandboxUnavailable).",
    )


class DataSpec(_Model):
    """The prompts: training and held-out files or Hub datasets, their fields and reward."""

    train: Sources | None = Field(
        None,
        description="Training prompts: JSONL (one object per line) or Parquet (.parquet), or a "
        "Hub dataset hf://datasets/org/name[@revision][/path] (its train split); or a list of "
        "sources, each {path, reward, domain, split, dataFiles}, to mix domains (math and code) "
        "in one run.",
    )
    prompt_field: str = Field("prompt", min_length=1, description="Column holding the prompt.")
    answer_field: str = Field(
        "answer", min_length=1, description="Column holding the reference answer."
    )
    system_prompt: str | None = Field(
        None, description="System message; used only with chatTemplate: true."
    )
    chat_template: Bool = Field(
        False,
        description="Format prompts with the tokenizer's chat template (instruct models); "
        "false sends the raw prompt text (base models).",
    )
    validation: ValidationSpec = ValidationSpec()
    reward: str = Field(
        "math",
        description="math (math-verify) | exact | code (the answer's program run against the "
        "row's tests in a sandbox) | module:function returning +1/-1.",
    )
    code: CodeSpec = Field(
        CodeSpec(), description="Limits of the sandbox that runs programs for reward: code."
    )
    log_consumed: Bool = Field(
        False,
        description="Write which prompts each training step took (id, epoch, generator) to "
        "consumed.jsonl beside history.jsonl: a line per step, so off for large runs.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_name(cls, value: str) -> str:
        problem = reward_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _few_domains(self) -> DataSpec:
        for field, sources in (("train", self.train_sources), ("validation.path", self.held_out)):
            domains = {s.domain or default_domain(s.reward or self.reward) for s in sources()}
            if len(domains) > MAX_DOMAINS:
                raise _at(field, f"{len(domains)} domains, more than {MAX_DOMAINS}")
        return self

    def train_sources(self) -> list[DataSource]:
        """data.train as sources, each with its reward filled in (a file named alone, or a
        source naming none, takes spec.data.reward); a domain stays None where the source names
        none, since a row's own reward then decides it (`default_domain`)."""
        return self._filled(self.train)

    def held_out(self) -> list[DataSource]:
        """data.validation.path as sources (rewards filled in); [] when held out from train."""
        path = self.validation.path
        return [] if path is None else self._filled(path)

    def rewards(self) -> list[str]:
        """The rewards the sources name (spec.data.reward where they name none), in order;
        rows may name others (checked when they are read)."""
        names = [s.reward or self.reward for s in self.train_sources() + self.held_out()]
        return list(dict.fromkeys(names))

    def _filled(self, value: str | list[DataSource] | None) -> list[DataSource]:
        if value is None:
            return []
        sources = [DataSource(path=value)] if isinstance(value, str) else value
        return [s.model_copy(update={"reward": s.reward or self.reward}) for s in sources]
