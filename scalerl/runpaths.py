"""A run's model and data as the processes read them: absolute paths, `builtin:` names built and
cached, hf:// ids resolved to a commit and downloaded (`scalerl.hub`). `scalerl run`, `scalerl
validate` and the independent evaluator (`scalerl.hfeval`) read a spec through it alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.hub import TRAIN_SPLITS, VALIDATION_SPLITS, RunSources, is_hub
from scalerl.spec import ScaleRLRun, parse_run


def resolve_paths(run: ScaleRLRun, hub: RunSources | None = None) -> ScaleRLRun:
    """Absolute paths for the processes: `builtin:` names are built (once) and cached; hf:// ids
    are resolved to a commit and downloaded (once) by `hub` (`scalerl.hub`; a run's own keeps the
    commits its run directory recorded), a data source becoming the files of its split."""
    from scalerl.demo.builtins import is_builtin, resolve_builtin

    hub = RunSources() if hub is None else hub
    data = run.model_dump(by_alias=True, mode="json")
    spec = data["spec"]

    def resolve(value: str) -> str:
        path = resolve_builtin(value) if is_builtin(value) else Path(value).expanduser().resolve()
        return str(path)

    def resolve_files(
        value: str | list[dict[str, Any]], field: str, splits: tuple[str, ...]
    ) -> str | list[dict[str, Any]]:
        """A file, or each file of a list of sources; a Hub dataset's files each a source."""
        if isinstance(value, str) and not is_hub(value):
            return resolve(value)
        if isinstance(value, str):
            files = hub.dataset(field, value, default_splits=splits)
            return files[0] if len(files) == 1 else [{"path": f} for f in files]
        sources: list[dict[str, Any]] = []
        for i, source in enumerate(value):
            if not is_hub(source["path"]):
                sources.append({**source, "path": resolve(source["path"])})
                continue
            selection = (source.get("split"), source.get("dataFiles") or ())
            files = hub.dataset(f"{field}[{i}]", source["path"], *selection, splits)
            sources += [{**source, "path": f, "split": None, "dataFiles": None} for f in files]
        return sources

    model = spec["model"]["path"]
    spec["model"]["path"] = hub.model("model.path", model) if is_hub(model) else resolve(model)
    if spec["data"].get("train") is not None:
        spec["data"]["train"] = resolve_files(spec["data"]["train"], "data.train", TRAIN_SPLITS)
    if spec["data"]["validation"].get("path"):
        spec["data"]["validation"]["path"] = resolve_files(
            spec["data"]["validation"]["path"], "data.validation.path", VALIDATION_SPLITS
        )
    return parse_run(data)  # a SpecError if a dataset's files are more than a list holds
