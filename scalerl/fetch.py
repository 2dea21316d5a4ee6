"""`scalerl fetch-sources`: what a cluster run's initializer Job runs before its gang exists.

It resolves each hf:// value of the spec to a commit and downloads that commit into Hugging
Face's cache on the run's claim (HF_HUB_CACHE), exactly as `scalerl run` does locally
(scalerl.hub.RunSources): a download cut off resumes from its `.incomplete` files, a commit whose
files are in the cache is not downloaded again, and a run whose directory records commits
(sources.json) loads those. It writes the records to the run directory (sources.json) and, for a
run in a cluster, to status.sources with the SourcesReady condition; a failure is the one line of
scalerl.hub.explain, in that condition's message and on stderr. The operator reads the status:
it is the only channel back from this pod (a kubelet's termination message may be off).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.errors import InputError
from scalerl.hub import TRAIN_SPLITS, VALIDATION_SPLITS, RunSources
from scalerl.operator.sources import (
    CONDITION,
    FAILED,
    MODEL_FIELD,
    RECORDED,
    VALIDATION_FIELD,
    wanted,
)
from scalerl.spec import ScaleRLRun
from scalerl.status.conditions import set_condition
from scalerl.status.kubernetes import RunStatus


def fetch(run: ScaleRLRun, out: Path) -> list[dict[str, Any]]:
    """Resolve and download every hf:// value of `run` (the fields and order of
    scalerl.runpaths.resolve_paths); sources.json in `out`; the records."""
    hub = RunSources.of_run(out)
    for want in wanted(run):
        if want.field == MODEL_FIELD:
            hub.model(want.field, want.uri)
        else:
            splits = VALIDATION_SPLITS if want.field.startswith(VALIDATION_FIELD) else TRAIN_SPLITS
            hub.dataset(want.field, want.uri, want.split, want.data_files, splits)
        print(hub.resolved[-1][1].line(), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    hub.write(out)
    return hub.records()


def fetch_into_status(run: ScaleRLRun, out: Path, status: RunStatus | None) -> int:
    """`fetch`, with its outcome in the run's status when `status` is given: the records and
    SourcesReady=True, or SourcesReady=False with the line that says why (then re-raised)."""
    try:
        records = fetch(run, out)
    except InputError as err:
        if status is not None:
            _report(status, False, FAILED, str(err), None)
        raise
    if status is not None:
        said = f"{len(records)} hf:// source(s) resolved and in the cache"
        _report(status, True, RECORDED, said, records)
    return 0


def _report(
    status: RunStatus, ok: bool, reason: str, message: str, records: list[dict[str, Any]] | None
) -> None:
    def change(obj: dict[str, Any]) -> dict[str, Any]:
        current = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        conditions = set_condition(
            list((current or {}).get("conditions") or []), CONDITION, ok, reason, message
        )
        fields: dict[str, Any] = {"conditions": conditions}
        if records is not None:
            fields["sources"] = records
        return fields

    status.update(change)
