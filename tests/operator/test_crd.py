"""The ScaleRLRun CRD as generated from scalerl.spec: fresh, named and shaped as documented, with
the spec's defaults. What a real API server admits and refuses with it (every valid spec, the CEL
rules' messages) is tests/cluster/test_crd_admission.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from scalerl.operator import crd
from scalerl.spec import RunSpec

ROOT = Path(__file__).resolve().parents[2]
CRD = crd.build_crd()
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
MINIMAL = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "math-8b"},
    "spec": {"model": {"path": "/models/base"}, "data": {"train": "/data/train.jsonl"}},
}


def with_spec(**spec: Any) -> dict[str, Any]:
    run = copy.deepcopy(MINIMAL)
    run["spec"].update(spec)
    return run


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        (crd.CRD_FILE, "run"),
        (crd.CHART_CRD_FILE, "run"),
        (crd.SWEEP_CRD_FILE, "sweep"),
        (crd.CHART_SWEEP_CRD_FILE, "sweep"),
    ],
    ids=str,
)
def test_committed_crd_files_are_a_fresh_generation(path: Path, resource: str) -> None:
    committed = (ROOT / path).read_text()
    assert committed == crd.render_crd(resource), f"{path} is stale: run `make crds`"


def test_the_sweep_crd_is_named_as_documented() -> None:
    sweep = crd.build_sweep_crd()
    names = sweep["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "ScaleRLSweep",
        "scalerlsweeps",
        ["srls"],
    )
    columns = [c["name"] for c in sweep["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:5] == ["Phase", "Leader", "A", "Running", "Stopped"]


def test_crd_names_the_resource_as_documented() -> None:
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == "scalerlruns.scalerl.dev"
    assert (names["kind"], names["plural"]) == ("ScaleRLRun", "scalerlruns")
    assert names["shortNames"] == ["srl"] and names["categories"] == ["scalerl"]
    assert VERSION["name"] == "v1alpha1"
    # `kubectl scale srl/NAME --replicas=N` sizes the generator pool; it reads the running ones.
    assert VERSION["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.generators.replicas",
            "statusReplicasPath": ".status.generators.ready",
        },
    }


def test_printer_columns_show_phase_progress_and_prediction() -> None:
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.progress.step",
        "PassRate": ".status.progress.evalPassRate",
        "A": ".status.prediction.A",
        "A>=": ".status.prediction.A_atLeast",  # a curve not yet bent bounds A only from below
        "C_mid": ".status.prediction.C_mid",
        "Confidence": ".status.prediction.confidence",  # TooEarly says the numbers are not
        "Law": ".status.prediction.lawCheck",  # -o wide only: the law alone, apart (Holds)
        "Gens": ".status.generators.ready",  # generator pods running (one replaced alone)
        "Replaced": ".status.generators.replaced",  # -o wide only: replacements so far
        "Trunc": ".status.progress.truncationRate",
        "Age": ".metadata.creationTimestamp",
        "Message": ".status.message",  # -o wide only: why the run is in its phase
        "A by domain": ".status.prediction.A_byDomain",  # -o wide only: one A per domain
    }
    assert [c["name"] for c in VERSION["additionalPrinterColumns"] if c.get("priority")] == [
        "Law",
        "Replaced",
        "Message",
        "A by domain",
    ]
    status = SCHEMA["properties"]["status"]["properties"]
    for path in columns.values():
        parts = path.strip(".").split(".")
        if parts[0] == "status":  # every column names a field of the status schema
            node = status[parts[1]]
            for part in parts[2:]:
                node = node["properties"][part]


def test_the_readmes_kubectl_get_srl_shows_the_printer_columns() -> None:
    # kubectl prints NAME, then each column of priority 0 in capitals.
    readme = (ROOT / "README.md").read_text().splitlines()
    at = readme.index("kubectl get srl")
    header, row = readme[at + 1].split(), readme[at + 2].split()
    shown = [
        c["name"].upper() for c in VERSION["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert header == ["NAME", *shown]
    assert len(row) == len(header)


def test_the_column_texts_name_the_compute_unit_and_every_confidence_word() -> None:
    text = {c["name"]: c.get("description", "") for c in VERSION["additionalPrinterColumns"]}
    assert "GPU-hours; process-hours for a CPU run" in text["C_mid"]
    for word in ("TooEarly", "Unchecked", "Misfit", "OK"):
        assert word in text["Confidence"], word
    prediction = SCHEMA["properties"]["status"]["properties"]["prediction"]["properties"]
    for field in ("C_mid", "budget", "computeToTarget"):
        assert "process-hours for a CPU run" in prediction[field]["description"], field


def test_loss_union_is_one_object_tagged_by_type() -> None:
    loss = SPEC["properties"]["recipe"]["properties"]["loss"]
    assert loss["properties"]["type"]["enum"] == ["cispo", "dapo", "grpo", "gspo"]
    assert loss["required"] == ["type"]
    assert loss["default"] == {"type": "cispo", "epsilonMax": 4.0}
    window = SPEC["properties"]["recipe"]["properties"]["length"]["properties"]["interruption"]
    assert window["properties"]["window"]["minItems"] == window["properties"]["window"]["maxItems"]


def _schema_defaults(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple]:
    found = [(path, node["default"])] if "default" in node else []
    for name, sub in (node.get("properties") or {}).items():
        found += _schema_defaults(sub, (*path, name))
    return found


def _pydantic_default(path: tuple[str, ...]) -> Any:
    model: type[BaseModel] = RunSpec
    field = None
    for part in path:
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == part)
        annotation = field.annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)]
        candidates = [annotation, *inner]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), model
        )
    assert field is not None
    default = field.get_default(call_default_factory=True)
    return (
        default.model_dump(by_alias=True, mode="json")
        if isinstance(default, BaseModel)
        else default
    )


@pytest.mark.parametrize(("path", "default"), _schema_defaults(SPEC), ids=lambda v: str(v))
def test_every_crd_default_is_the_spec_default(path: tuple[str, ...], default: Any) -> None:
    expected = _pydantic_default(path)
    if isinstance(default, dict) and default == {}:
        assert isinstance(expected, dict)  # {}: the nested defaults fill it (checked one by one)
    else:
        assert default == (list(expected) if isinstance(expected, tuple) else expected)
