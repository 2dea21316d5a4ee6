"""A run's hf:// sources as the operator sees them: which fields name one, whether the
initializer recorded them all (status.sources), and the spec the gang's pods read, with every id
replaced by the local files the initializer downloaded.

The gang never resolves an id: the operator writes the local paths into the run's ConfigMap (the
spec the processes read) and the pods run with HF_HUB_OFFLINE=1, so a process cannot reach the
Hub even by accident and every process loads the commit the initializer recorded. Pure: no
huggingface_hub (the operator image has none); the same substitution as `scalerl run` makes
locally (scalerl.runpaths.resolve_paths), which tests/operator compares it against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scalerl.spec import HUB_PREFIX, DataSource, ScaleRLRun, parse_run

MODEL_FIELD = "model.path"
TRAIN_FIELD = "data.train"
VALIDATION_FIELD = "data.validation.path"
# The Hugging Face cache is the claim's hub/ folder, at this path in every pod of the run (the
# initializer mounts the claim whole at /store; a gang pod mounts hub/ alone, read-only), so the
# paths the initializer records are the paths the gang's processes open.
STORE_DIR = "/store"
HUB_SUBDIR = "hub"
CACHE_DIR = f"{STORE_DIR}/{HUB_SUBDIR}"
# The condition the initializer's pod writes (scalerl.fetch): True once status.sources holds
# every source; False with the one line of scalerl.hub.explain when one cannot be read.
CONDITION = "SourcesReady"
RECORDED, FAILED = "Downloaded", "DownloadFailed"


@dataclass(frozen=True)
class Wanted:
    """One hf:// value of the spec, as the initializer's record of it names it."""

    field: str  # model.path, data.train, data.train[1], data.validation.path, ...
    uri: str
    split: str | None = None
    data_files: tuple[str, ...] = ()

    def matches(self, record: dict[str, Any]) -> bool:
        said = (record.get("uri"), record.get("split"), tuple(record.get("dataFiles") or ()))
        return record.get("field") == self.field and said == (self.uri, self.split, self.data_files)


def _is_hub(value: object) -> bool:
    return isinstance(value, str) and value.startswith(HUB_PREFIX)


def wanted(run: ScaleRLRun) -> list[Wanted]:
    """Every hf:// value of the run's spec, in the order the initializer resolves them."""
    spec = run.spec
    out = [Wanted(MODEL_FIELD, spec.model.path)] if _is_hub(spec.model.path) else []
    if spec.data.train is not None:
        out += _data_wanted(TRAIN_FIELD, spec.data.train)
    if spec.data.validation.path is not None:
        out += _data_wanted(VALIDATION_FIELD, spec.data.validation.path)
    return out


def _data_wanted(field: str, value: str | Sequence[DataSource]) -> list[Wanted]:
    if isinstance(value, str):
        return [Wanted(field, value)] if _is_hub(value) else []
    return [
        Wanted(f"{field}[{i}]", s.path, s.split, tuple(s.data_files or ()))
        for i, s in enumerate(value)
        if _is_hub(s.path)
    ]


def uses_hub(run: ScaleRLRun) -> bool:
    return bool(wanted(run))


def missing(run: ScaleRLRun, records: Sequence[dict[str, Any]]) -> list[Wanted]:
    """The run's hf:// values that no record names (the initializer has yet to resolve them)."""
    return [w for w in wanted(run) if not any(w.matches(r) for r in records)]


def localized(run: ScaleRLRun, records: Sequence[dict[str, Any]]) -> ScaleRLRun:
    """The run with every hf:// value replaced by its recorded local files: a model by its
    folder; a dataset named alone by its file (or a list of its files); a source of a list by
    one source per file, keeping its reward and domain. Every value must have its record."""
    by_field = {w.field: next(r for r in records if w.matches(r)) for w in wanted(run)}
    document = run.model_dump(by_alias=True, mode="json")
    spec = document["spec"]
    if MODEL_FIELD in by_field:
        spec["model"]["path"] = str(by_field[MODEL_FIELD]["path"])
    if spec["data"].get("train") is not None:
        spec["data"]["train"] = _local_data(TRAIN_FIELD, spec["data"]["train"], by_field)
    if spec["data"]["validation"].get("path") is not None:
        validation = spec["data"]["validation"]
        validation["path"] = _local_data(VALIDATION_FIELD, validation["path"], by_field)
    return parse_run(document)


def _local_data(
    field: str, value: str | list[dict[str, Any]], by_field: dict[str, dict[str, Any]]
) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        if field not in by_field:
            return value
        files = [str(f) for f in by_field[field]["files"]]
        return files[0] if len(files) == 1 else [{"path": f} for f in files]
    out: list[dict[str, Any]] = []
    for i, source in enumerate(value):
        record = by_field.get(f"{field}[{i}]")
        if record is None:
            out.append(source)
            continue
        local = {"split": None, "dataFiles": None}
        out += [{**source, **local, "path": str(f)} for f in record["files"]]
    return out


def gang_environ() -> dict[str, str]:
    """What a gang pod of a run with hf:// sources runs with: the cache, and offline, so no
    process reaches the Hub (every file is on the claim already)."""
    return {"HF_HUB_CACHE": CACHE_DIR, "HF_HUB_OFFLINE": "1"}


def gang_mount() -> dict[str, Any]:
    """The claim's cache in a gang pod: at the initializer's path, read-only (nothing but the
    initializer writes it)."""
    return {"name": "store", "mountPath": CACHE_DIR, "subPath": HUB_SUBDIR, "readOnly": True}
