"""A ScaleRLSweep: variants of one run (JSON merge patches of a base spec), compared the paper's
way, and its parsing at the edge (`load_sweep`, `parse_sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from scalerl.errors import SpecError
from scalerl.spec.base import _DNS_LABEL, API_VERSION, Int, _at, _Model, _Resource
from scalerl.spec.evaluation import PREDICTION_MIN_POINTS
from scalerl.spec.parsing import _load, _problems
from scalerl.spec.run import KIND, RunSpec, ScaleRLRun, parse_run

SWEEP_KIND = "ScaleRLSweep"
# A variant's phase in a sweep's leaderboard, locally and on a cluster alike.
VARIANT_PHASES = PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED = (
    "Pending",
    "Running",
    "Stopped",
    "Succeeded",
    "Failed",
)
# A variant's run is "<sweep>-<variant>": short names leave room for the run's own children.
MAX_VARIANT_NAME = 20
VariantName = Annotated[
    str, Field(min_length=1, max_length=MAX_VARIANT_NAME, pattern=_DNS_LABEL.pattern)
]


class VariantSpec(_Model):
    """One variant of the sweep: its name and its patch of spec.base."""

    name: VariantName = Field(description="The variant; its run is <sweep>-<name>.")
    patch: dict[str, Any] = Field(
        default_factory=dict,
        description="A JSON merge patch of spec.base (RFC 7386: null removes a field, so its "
        "default applies).",
    )


class EarlyStopSpec(_Model):
    """Stop a variant that cannot win: measured clearly below the best variant at the same
    compute, and its ceiling below the best one's floor (`scalerl.fit.earlystop`); the rest of
    its budget is saved."""

    min_points: Int = Field(
        PREDICTION_MIN_POINTS,
        ge=PREDICTION_MIN_POINTS,
        le=10_000,
        description="Judge a variant (and count one as the yardstick) only once it has this "
        f"many trained evaluations past fit.minCompute (at least {PREDICTION_MIN_POINTS}: a "
        "fit of fewer is TooEarly, and its bootstrap interval for A can be far too narrow).",
    )


class SweepSpec(_Model):
    base: dict[str, Any] = Field(description="The ScaleRLRun spec every variant starts from.")
    variants: list[VariantSpec] = Field(min_length=1, max_length=100)
    max_parallel: Int = Field(2, ge=1, le=100, description="Variants running at once.")
    early_stop: EarlyStopSpec | None = Field(
        EarlyStopSpec(), description="null: every variant runs to its budget."
    )

    @model_validator(mode="after")
    def _names_unique(self) -> SweepSpec:
        names = [v.name for v in self.variants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _at("variants", f"names must be unique; repeated: {', '.join(twice)}")
        return self


class ScaleRLSweep(_Resource):
    kind: Literal["ScaleRLSweep"]
    spec: SweepSpec
    # A run's fields belong in the sweep's base.
    nested_homes: ClassVar[tuple[tuple[str, type[BaseModel]], ...]] = (("spec.base", RunSpec),)

    def variant_runs(self) -> dict[str, ScaleRLRun]:
        """Each variant's run, by variant name: spec.base with the variant's patch, named
        <sweep>-<variant>. SpecError names every problem, variant by variant."""
        runs, problems = {}, []
        for i, variant in enumerate(self.spec.variants):
            obj = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": f"{self.name}-{variant.name}"}
                | ({"namespace": self.metadata.namespace} if self.metadata.namespace else {}),
                "spec": patched(self.spec.base, variant.patch),
            }
            where = f"spec.variants.{i} ({variant.name}): "
            try:
                runs[variant.name] = parse_run(obj)
            except SpecError as err:
                problems += [where + problem for problem in err.problems]
                continue
            first = next(iter(runs.values()))
            problems += [where + p for p in _protocol_changes(first, runs[variant.name])]
        if problems:
            raise SpecError(problems)
        return runs


def patched(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A variant's run spec: `base` with `patch` merged (RFC 7386), except that a patch naming
    another loss type replaces the loss block (a tagged union: the base loss's own fields, such
    as cispo's epsilonMax, mean nothing to another loss)."""
    spec = merge_patch(base, patch)
    loss, base_loss = _loss_block(patch), _loss_block(base)
    if isinstance(loss, dict) and "type" in loss and loss["type"] != (base_loss or {}).get("type"):
        spec["recipe"]["loss"] = merge_patch({}, loss)
    return dict(spec)


def _loss_block(spec: dict[str, Any]) -> Any:
    recipe = spec.get("recipe")
    return recipe.get("loss") if isinstance(recipe, dict) else None


def _protocol_changes(first: ScaleRLRun, run: ScaleRLRun) -> list[str]:
    """How `run` evaluates otherwise than the sweep's first variant: its pass rates would not be
    comparable (other prompts, another k, another model), so neither its rank nor a stop."""
    a, b = first.spec, run.spec
    differs = {
        "data.validation": a.data.validation != b.data.validation,
        "evaluation.generationsPerPrompt": a.evaluation.generations_per_prompt
        != b.evaluation.generations_per_prompt,
        "model": a.model != b.model,
    }
    return [
        f"spec.{name}: a sweep's variants share the evaluation protocol (their pass rates are "
        f"compared); this variant changes it from the first variant's"
        for name, changed in differs.items()
        if changed
    ]


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as a JSON merge patch (RFC 7386); `target` is not changed."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def parse_sweep(obj: Any) -> ScaleRLSweep:
    """Validate a ScaleRLSweep and every variant's run; SpecError lists every bad field."""
    if not isinstance(obj, dict):
        raise SpecError([f"a ScaleRLSweep must be a mapping, got {type(obj).__name__}"])
    obj = {k: v for k, v in obj.items() if k != "status"}
    try:
        sweep = ScaleRLSweep.model_validate(obj)
    except ValidationError as err:
        raise SpecError(_problems(err, ScaleRLSweep)) from None
    sweep.variant_runs()
    return sweep


def load_sweep(path: str | Path) -> ScaleRLSweep:
    """Read and validate a YAML file holding one ScaleRLSweep."""
    return _load(path, parse_sweep)
