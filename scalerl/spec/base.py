"""What every part of the ScaleRLRun resource shares: strict numbers and their bounds, the frozen
camelCase model, the message form of a validator that names a field below its model, and the
Kubernetes object around a spec (apiVersion, kind, metadata).

This package must stay light: no torch, no vLLM, no kopf.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_VERSION = "scalerl.dev/v1alpha1"
HUB_PREFIX = "hf://"  # a Hub id (scalerl.hub resolves it; the operator only recognises it)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A model validator's message that starts with this names a field below the validated model, so
# the user reads "spec.recipe.length.interruption.enabled: ..." rather than "spec: ...".
_AT = "@"

# Numbers are strict: YAML's `true` or "1e-3" where a number belongs is a mistake, not a value,
# and inf/NaN can only be typos. Upper bounds (`le=`) catch values that can only be typos too.
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Int = Annotated[int, Field(strict=True)]
Bool = Annotated[bool, Field(strict=True)]
MAX_TOKENS = 1 << 20  # lengths and budgets, in tokens
MAX_REPLICAS = 10_000
MAX_GPUS = 64  # per replica (one node)
MAX_STEPS = 100_000_000


def _at(field: str, message: str) -> ValueError:
    return ValueError(f"{_AT}{field}: {message}")


class _Model(BaseModel):
    """Frozen, camelCase in YAML, unknown fields rejected."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    namespace: str | None = None


class _Resource(BaseModel):
    """A scalerl.dev object: its apiVersion, kind and metadata as Kubernetes has them.

    Nothing else may stand at the top: a block indented one level too little (`budget:` at
    column 0) would otherwise be dropped without a word and the run get the defaults. Kubernetes'
    own additions live in metadata (which allows them) and in status (which parsing skips)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    api_version: Literal["scalerl.dev/v1alpha1"] = Field(alias="apiVersion")
    metadata: Metadata
    # Other places besides metadata and spec where a misplaced top-level key may belong, as
    # (prefix, model): the "did you mean" of a parse error (scalerl.spec.parsing).
    nested_homes: ClassVar[tuple[tuple[str, type[BaseModel]], ...]] = ()

    @property
    def name(self) -> str:
        return self.metadata.name
