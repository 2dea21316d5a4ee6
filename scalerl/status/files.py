"""The local end of the status sink: files in the run directory.

`history.jsonl` (one line per evaluation; the input of `scalerl fit`), `evaluations/` (what each
evaluation scored, per prompt), `progress.json` (live progress, replaced atomically) and
`status.json` (conditions), read by the local runner's display and by users.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalerl.status.conditions import set_condition
from scalerl.status.history import HistoryRow, Progress, PromptScore, RunFiles, atomic_write

STATUS_FILE = "status.json"
# Generators the trainer gave up while their processes looked alive, one JSON line each
# ({"role", "pid", "host", "reason"}): the local runner ends each (scalerl.local) and replaces it.
GAVE_UP_FILE = "gave-up.jsonl"


class FileStatus:
    def __init__(self, run_dir: Path) -> None:
        self.files = RunFiles(run_dir)
        self.path = run_dir / STATUS_FILE
        self.conditions: list[dict[str, Any]] = read_status(self.path).get("conditions", [])

    def restore(self, evaluations: list[dict[str, Any]]) -> None:
        self.files.rewrite_history(evaluations)

    def progress(self, progress: Progress) -> None:
        self.files.write_progress(progress.to_dict())

    def evaluation(
        self, row: HistoryRow, scores: list[PromptScore], completions: list[dict[str, Any]]
    ) -> None:
        # The records first: a history row never points at an evaluation nobody can recount.
        self.files.write_scores(row.step, scores)
        if completions:
            self.files.write_completions(row.step, completions)
        self.files.append_history(row.to_dict())

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        updated = set_condition(self.conditions, type_, status, reason, message)
        if updated != self.conditions:
            self.conditions = updated
            atomic_write(self.path, json.dumps({"conditions": updated}, indent=2))

    def gave_up(self, generator: int, pid: int | None, host: str | None, reason: str) -> None:
        line = {"role": f"generator-{generator}", "pid": pid, "host": host, "reason": reason}
        with (self.path.parent / GAVE_UP_FILE).open("a") as out:
            out.write(json.dumps(line) + "\n")

    def desired_generators(self) -> int | None:
        return None


def read_status(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
