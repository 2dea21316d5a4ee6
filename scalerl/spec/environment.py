"""Multi-turn and tool-use rollouts from an environment users already have: a verifiers package
or an OpenEnv server."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from scalerl.redact import redact_url
from scalerl.spec.base import MAX_REPLICAS, Float, Int, _Model


class VerifiersEnvironment(_Model):
    """A verifiers environment package (the classic API of verifiers 0.3.1), as prime-rl loads
    it: the same package, unchanged."""

    id: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.\-/]+$",
        description="Its id (tool-arith imports the module tool_arith), loaded with verifiers' "
        "own load_environment; the package must be installed where the generators run.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of its load_environment."
    )


class IndexSecret(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the run's namespace.")
    key: str = Field(
        "PIP_INDEX_URL",
        min_length=1,
        max_length=253,
        description="The Secret's key holding the index URL.",
    )


class OpenEnvEnvironment(_Model):
    """An OpenEnv environment server (reset/step over HTTP and WebSocket) the rollouts drive
    through scalerl's adapter; the prompts come from spec.data.train (each row goes to reset)."""

    app: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="The server's ASGI app as module:attribute: a local run starts it on "
        "127.0.0.1 and stops it with the run.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="The server's image: on a cluster the operator runs it as a Deployment "
        "and Service of the run (removed with it).",
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="A server already running (http://host:port); nothing is started.",
    )
    port: Int = Field(8000, ge=1, le=65535, description="The port the server listens on.")
    replicas: Int = Field(
        1, ge=1, le=MAX_REPLICAS, description="On a cluster: server pods behind the Service."
    )

    @model_validator(mode="after")
    def _somewhere(self) -> OpenEnvEnvironment:
        if self.app is None and self.image is None and self.url is None:
            raise ValueError("set app (local), image (cluster) or url (a running server)")
        return self


class EnvironmentSpec(_Model):
    """Multi-turn and tool-use rollouts from an environment users already have, instead of
    data.train + data.reward: its dataset gives the prompts, its rubric the reward."""

    verifiers: VerifiersEnvironment | None = Field(
        None, description="A verifiers environment package (its dataset, eval split, rubric)."
    )
    openenv: OpenEnvEnvironment | None = Field(
        None, description="An OpenEnv server; the prompts come from data.train."
    )
    pass_threshold: Float = Field(
        0.5,
        ge=-1e9,
        le=1e9,
        description="A rollout passes (pass rate, curriculum, the fit) when its reward is at "
        "least this and it was not truncated; the advantage uses the reward itself.",
    )
    max_turns: Int = Field(
        8, ge=1, le=1000, description="Model turns per rollout at most (with the env's own)."
    )
    tool_timeout_seconds: Float = Field(
        30.0,
        gt=0,
        le=86_400,
        description="Wall time of one tool call; past it the model reads a tool error.",
    )
    max_tool_output_chars: Int = Field(
        8192,
        ge=16,
        le=1 << 24,
        description="A tool's or the environment's message is cut to this many characters "
        "(the cut is said in the message) before it is tokenized.",
    )
    rollout_timeout_seconds: Float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Wall time of one rollout; past it the rollout is dropped and counted.",
    )
    packages: list[str] = Field(
        default_factory=list,
        description="On a cluster: pip requirements (the environment package) installed into "
        "the generator pods at start, from the cluster's package index; or build an image FROM "
        "scalerl's and leave this empty.",
    )
    index_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="The package index `packages` are installed from, without credentials (it "
        "is in the pods' commands); null: pip's default. A private index: indexSecret.",
    )
    index_secret: IndexSecret | None = Field(
        None,
        description="On a cluster: the Secret (and key) whose value is the package index URL "
        "with its credentials (https://user:token@host/simple); the packages' init container "
        "reads it as PIP_INDEX_URL, so it is in no pod command, spec or tracker.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> EnvironmentSpec:
        if (self.verifiers is None) == (self.openenv is None):
            raise ValueError("set exactly one of verifiers and openenv")
        if self.index_url is not None and self.index_secret is not None:
            raise ValueError("set indexUrl or indexSecret, not both")
        if self.index_url is not None and redact_url(self.index_url) != self.index_url:
            raise ValueError(
                f"indexUrl holds credentials ({redact_url(self.index_url)}), which every "
                "reader of the run, its pods and its trackers would see: put the URL in a "
                "Secret and name it in indexSecret"
            )
        return self
