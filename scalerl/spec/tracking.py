"""Experiment trackers (scalerl.tracking) and how a cluster's initializer reads hf:// ids (the
Hub's token Secret and mirror)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scalerl.spec.base import _Model


class MlflowTracking(_Model):
    uri: str | None = Field(
        None,
        min_length=1,
        description="MLflow tracking URI (http://host:5000, sqlite:///path.db); null: "
        "MLFLOW_TRACKING_URI from the environment.",
    )
    experiment: str = Field(
        "scalerl", min_length=1, description="MLflow experiment the run's MLflow run goes in."
    )


class TensorboardTracking(_Model):
    dir: str = Field(
        "tensorboard",
        min_length=1,
        description="Folder of the event files; relative to the run directory. The run writes "
        "into <dir>/<run name>.",
    )


class WandbTracking(_Model):
    project: str = Field("scalerl", min_length=1, description="W&B project.")
    entity: str | None = Field(None, min_length=1, description="W&B entity; null: the default.")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online",
        description="online: sync as it runs (WANDB_API_KEY); offline: files in the run "
        "directory's wandb/ folder, `wandb sync` later; disabled: nothing.",
    )


class TrackioTracking(_Model):
    project: str = Field("scalerl", min_length=1, description="trackio project.")


class SecretRef(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the run's namespace.")


class HubTokenSecret(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the run's namespace.")
    key: str = Field(
        "HF_TOKEN", min_length=1, max_length=253, description="The Secret's key holding the token."
    )


class HubSpec(_Model):
    """How a cluster's initializer Job reads the run's hf:// ids (locally: HF_TOKEN and
    HF_ENDPOINT from the environment)."""

    token_secret: HubTokenSecret | None = Field(
        None,
        description="On a cluster: the Secret (and key) whose value is HF_TOKEN of the "
        "initializer Job alone, which downloads the hf:// sources; the training pods never hold "
        "it. Null: no token (public repos).",
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="On a cluster: the Hub the initializer downloads from (HF_ENDPOINT: a "
        "self-hosted mirror); null: huggingface.co.",
    )


class TrackingSpec(_Model):
    """Experiment trackers the trainer (steps, evaluations) and the fit (A, B, C_mid) log to:
    one tracker run per ScaleRLRun, the same one after a restart."""

    mlflow: MlflowTracking | None = Field(None, description="Log to MLflow.")
    tensorboard: TensorboardTracking | None = Field(None, description="Write TensorBoard files.")
    wandb: WandbTracking | None = Field(None, description="Log to Weights & Biases.")
    trackio: TrackioTracking | None = Field(None, description="Log to trackio (local-first).")
    secret_ref: SecretRef | None = Field(
        None,
        description="On a cluster: a Secret whose keys become environment variables of the pods "
        "that log (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...). Locally the environment is used.",
    )

    @property
    def trackers(self) -> list[str]:
        """The trackers switched on, by name."""
        return [n for n in ("mlflow", "tensorboard", "wandb", "trackio") if getattr(self, n)]
