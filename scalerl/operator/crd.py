"""The ScaleRLRun CustomResourceDefinition, generated from `scalerl.spec`.

`scalerl.spec` is the one source of defaults and validation; this module converts its pydantic
JSON schema into the structural OpenAPI v3 subset Kubernetes accepts (no `$ref`, no `anyOf`,
`nullable` instead of null variants, one object for the tagged loss union) and adds what JSON
schema cannot say: CEL rules for checks that span fields (pydantic model validators) and for fields
that must not change once a run exists. `make crds` writes `crds/scalerlruns.scalerl.dev.yaml`;
a test fails when the committed file differs from a fresh generation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from scalerl.metrics import COMPUTE_UNIT
from scalerl.operator import schema
from scalerl.operator.names import MAX_RUN_NAME, RUN_NAME_PATTERN
from scalerl.spec import RunSpec, SweepSpec

GROUP = "scalerl.dev"
VERSION = "v1alpha1"
KIND = "ScaleRLRun"
PLURAL = "scalerlruns"
SHORT_NAME = "srl"
CATEGORY = "scalerl"
CRD_FILE = Path("crds") / f"{PLURAL}.{GROUP}.yaml"
# The chart ships the same file (Helm installs crds/ once; see the chart's NOTES.txt).
CHART_CRD_FILE = Path("helm/scalerl") / CRD_FILE
HEADER = "# Generated from scalerl/spec.py by `make crds` (scalerl/operator/crd.py); do not edit.\n"

# Changing these would make the curve so far belong to a different experiment: a run's evaluations
# are only comparable under one model, data set, recipe, evaluation protocol and seed. The budget,
# fit cadence, failure policy, replicas and suspend stay editable.
IMMUTABLE = ("model", "data", "recipe", "evaluation", "seed")
IMMUTABLE_MESSAGE = (
    "is immutable: a run's curve belongs to one experiment; create a new ScaleRLRun instead"
)

# Cross-field rules: the pydantic model validators of scalerl.spec, restated in CEL. A null
# nullable field counts as absent for has(), so has(self.model.thinkEnd) means "not null".
SPEC_RULES = [
    {
        "rule": "has(self.model.thinkEnd) || !self.recipe.length.interruption.enabled",
        "message": "recipe.length.interruption.enabled must be false when model.thinkEnd is null "
        "(a model that does not think cannot be interrupted)",
        "fieldPath": ".recipe.length.interruption.enabled",
    },
    {
        "rule": "!has(self.checkpoint.claimName) == !has(oldSelf.checkpoint.claimName) && "
        "(!has(self.checkpoint.claimName) || "
        "self.checkpoint.claimName == oldSelf.checkpoint.claimName)",
        "message": "checkpoint.claimName is immutable: the run's checkpoints live on that volume",
        "fieldPath": ".checkpoint.claimName",
    },
    {
        "rule": "self.placement != 'colocated' || (self.trainers.replicas == 1 && "
        "self.generators.replicas == 1 && self.generators.tensorParallel == 1 && "
        "self.trainers.gpus <= 1 && self.generators.gpus == self.trainers.gpus)",
        "message": "placement colocated runs one process: trainers.replicas, generators.replicas "
        "and generators.tensorParallel must be 1, trainers.gpus 0 or 1, and generators.gpus "
        "equal to trainers.gpus",
        "fieldPath": ".placement",
    },
    {
        # A running gang's pods are built for one placement; the other would meet none of them.
        "rule": "self.placement == oldSelf.placement",
        "message": "placement is immutable: the run's pods are built for it; create a new "
        "ScaleRLRun instead",
        "fieldPath": ".placement",
    },
]
# The API server checks a node's `default` against the node's own rules as written, before the
# nested defaults fill it in: `length`'s default is {}, so every field the rule reads is guarded.
LENGTH_RULES = [
    {
        "rule": "!has(self.interruption) || !has(self.interruption.enabled) || "
        "!self.interruption.enabled || !has(self.interruption.window) || "
        "!has(self.thinkingBudget) || (0 < self.interruption.window[0] && "
        "self.interruption.window[0] <= self.interruption.window[1] && "
        "self.interruption.window[1] <= self.thinkingBudget)",
        "message": "interruption.window must satisfy 0 < start <= end <= thinkingBudget",
        "fieldPath": ".interruption.window",
    }
]
# Child names append "-generator-<index>" (an Indexed Job's pod hostname, a DNS label of at most
# 63 characters) and Services need a DNS-1035 label: stricter than scalerl.spec's DNS label.
ROOT_RULES = [
    {
        "rule": f"self.metadata.name.matches('{RUN_NAME_PATTERN}')",
        "message": f"metadata.name must start with a letter, use a-z, 0-9 and '-', and have at "
        f"most {MAX_RUN_NAME} characters (child names append '-generator-<index>')",
    }
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {
        "name": "PassRate",
        "type": "number",
        "jsonPath": ".status.progress.evalPassRate",
        "description": "Held-out pass rate at the last evaluation.",
    },
    {
        "name": "A",
        "type": "number",
        "jsonPath": ".status.prediction.A",
        "description": "Predicted asymptotic pass rate.",
    },
    {
        "name": "A>=",
        "type": "number",
        "jsonPath": ".status.prediction.A_atLeast",
        "description": "Where the points bound the asymptote only from below (the curve has "
        "not bent yet), that bound: A is at least this. Empty otherwise.",
    },
    {
        "name": "C_mid",
        "type": "number",
        "jsonPath": ".status.prediction.C_mid",
        "description": f"Compute ({COMPUTE_UNIT}) at half of the predicted gain.",
    },
    {
        "name": "Confidence",
        "type": "string",
        "jsonPath": ".status.prediction.confidence",
        "description": "Whether the forecast shown passed its half-run check: TooEarly (too "
        "few points past fit.minCompute), Unchecked (the check could not run yet), Misfit (the "
        "first half's forecast interval missed the last evaluation) or OK (it held).",
    },
    {
        "name": "Law",
        "type": "string",
        "jsonPath": ".status.prediction.lawCheck",
        "priority": 1,  # kubectl get -o wide
        "description": "Whether the run follows the law alone: Holds or Misses (the first "
        "half's law against the last evaluation); empty until the check can run.",
    },
    {
        "name": "Gens",
        "type": "integer",
        "jsonPath": ".status.generators.ready",
        "description": "Generator pods running now, of spec.generators.replicas (a failed one "
        "is replaced alone while training goes on). Empty for a colocated run.",
    },
    {
        "name": "Replaced",
        "type": "integer",
        "jsonPath": ".status.generators.replaced",
        "priority": 1,  # kubectl get -o wide
        "description": "Generators replaced alone so far (no gang restart).",
    },
    {
        "name": "Trunc",
        "type": "number",
        "jsonPath": ".status.progress.truncationRate",
        "description": "Fraction of the last batch's samples cut at the length budget.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "priority": 1,  # kubectl get -o wide
        "description": "Why the run is in its phase (while starting: what its pods wait for).",
    },
    {
        "name": "A by domain",
        "type": "string",
        "jsonPath": ".status.prediction.A_byDomain",
        "priority": 1,  # kubectl get -o wide
        "description": "A run of several domains: each domain's predicted A, fitted to its own "
        "pass rates, e.g. code=0.62 math=0.59. Empty for one domain.",
    },
]


def spec_schema() -> dict[str, Any]:
    """The structural schema of `spec`, with scalerl.spec's defaults, bounds and descriptions."""
    out = schema.convert(RunSpec.model_json_schema(by_alias=True, mode="validation"))
    out["description"] = (
        "A ScaleRL post-training run; every field is documented in scalerl/spec.py."
    )
    props = out["properties"]
    props["data"]["properties"]["reward"]["pattern"] = schema.REWARD_PATTERN
    props["recipe"]["properties"]["length"]["x-kubernetes-validations"] = LENGTH_RULES
    for name in IMMUTABLE:
        props[name]["x-kubernetes-validations"] = [
            {"rule": "self == oldSelf", "message": f"{name} {IMMUTABLE_MESSAGE}"}
        ]
    out["x-kubernetes-validations"] = SPEC_RULES
    return out


# `kubectl scale srl/NAME --replicas=N` sizes the generator pool while the run runs (the
# operator resizes its generators' Job: scalerl.operator.children.ensure_workloads).
SCALE = {
    "specReplicasPath": ".spec.generators.replicas",
    "statusReplicasPath": ".status.generators.ready",
}


def build_crd() -> dict[str, Any]:
    return _crd(KIND, PLURAL, SHORT_NAME, PRINTER_COLUMNS, _root_schema(), scale=SCALE)


def _crd(
    kind: str,
    plural: str,
    short_name: str,
    columns: list[dict[str, Any]],
    root: dict[str, Any],
    scale: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A namespaced CRD of ours: one served version with a status subresource (and `scale`'s
    paths, a scale subresource)."""
    subresources: dict[str, Any] = {"status": {}, **({"scale": scale} if scale else {})}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def _root_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "ScaleRLRun: a reinforcement-learning post-training run and its prediction.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": schema.status_schema(),
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


SWEEP_KIND, SWEEP_PLURAL, SWEEP_SHORT_NAME = "ScaleRLSweep", "scalerlsweeps", "srls"
SWEEP_CRD_FILE = Path("crds") / f"{SWEEP_PLURAL}.{GROUP}.yaml"
CHART_SWEEP_CRD_FILE = Path("helm/scalerl") / SWEEP_CRD_FILE
SWEEP_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Leader",
        "type": "string",
        "jsonPath": ".status.leader",
        "description": "The best variant so far by the paper's rule.",
    },
    {"name": "A", "type": "number", "jsonPath": ".status.leaderA"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
    {"name": "Stopped", "type": "integer", "jsonPath": ".status.stopped"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


def build_sweep_crd() -> dict[str, Any]:
    """The ScaleRLSweep CRD: its spec from scalerl.spec (the base and patches are free-form
    there; the operator checks every variant's run and says so in the status)."""
    spec = schema.convert(SweepSpec.model_json_schema(by_alias=True, mode="validation"))
    spec["description"] = (
        "Variants of one ScaleRLRun spec, run, fitted, ranked; see scalerl/spec.py."
    )
    root = {
        "type": "object",
        "description": "ScaleRLSweep: variants of a recipe compared the paper's way.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": schema.sweep_status_schema(),
        },
    }
    return _crd(SWEEP_KIND, SWEEP_PLURAL, SWEEP_SHORT_NAME, SWEEP_PRINTER_COLUMNS, root)


def render_crd(resource: str = "run") -> str:
    crd = build_sweep_crd() if resource == "sweep" else build_crd()
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write (or check) the ScaleRLRun (or ScaleRLSweep) CRD file."
    )
    parser.add_argument("--out", type=Path, default=CRD_FILE, help=f"default {CRD_FILE}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--resource", choices=("run", "sweep"), default="run")
    args = parser.parse_args(argv)
    text = render_crd(args.resource)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run `make crds`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
