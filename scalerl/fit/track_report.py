"""`scalerl track-record DIR...`: how good a set of finished runs' predictions were, from their
fit.json track records (`scalerl.fit.track`): a table by fraction of the run seen, its JSON, and
a picture."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.errors import DataError, InputError
from scalerl.fit.report import FIT_FILE
from scalerl.fit.track import Kept, summarise

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass
class Records:
    """The scored predictions of each finished run found, and why the other folders were not."""

    runs: dict[str, list[Kept]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self) -> list[dict[str, Any]]:
        return summarise(self.runs.values())

    def to_dict(self) -> dict[str, Any]:
        return {"runs": sorted(self.runs), "skipped": self.skipped, "bySeen": self.summary()}


def read_records(folders: list[Path]) -> Records:
    """The track records in the run folders `folders` (each holding a fit.json); a folder whose
    run has not ended yet (no trackRecord) is skipped, with the reason. A missing folder or an
    unreadable fit.json is an error: the user named it."""
    out = Records()
    for folder in folders:
        if not folder.is_dir():
            raise InputError(f"{folder}: not a run folder (no such directory)")
        path = folder / FIT_FILE
        if not path.exists():
            out.skipped[str(folder)] = f"no {FIT_FILE}: no fit yet"
            continue
        rows = _track_record(path)
        if rows is None:
            out.skipped[str(folder)] = f"no trackRecord in {FIT_FILE}: the run has not ended"
        else:
            out.runs[str(folder)] = rows
    if not out.runs:
        raise DataError(
            f"none of the {len(folders)} folders holds a finished run's track record "
            f"({FIT_FILE} with trackRecord): "
            + "; ".join(f"{k}: {v}" for k, v in out.skipped.items())
        )
    return out


def _track_record(path: Path) -> list[Kept] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: cannot read it ({err})") from None
    rows = data.get("trackRecord") if isinstance(data, dict) else None
    if rows is None:
        return None
    needed = ("fractionSeen", "error", "inside", "width")
    if not isinstance(rows, list) or any(
        not isinstance(r, dict) or any(k not in r for k in needed) for r in rows
    ):
        raise DataError(f"{path}: trackRecord must be a list of scored predictions with {needed}")
    return rows


def table(records: Records) -> str:
    """The summary as a plain-text table, one line per fraction seen, and the skipped folders."""
    header = (
        f"{'seen':>5}  {'runs':>4}  {'inside':>6}  {'coverage':>8}  {'median error':>12}  "
        f"{'median |error|':>14}  {'median width':>12}"
    )
    lines = [f"track record of {len(records.runs)} finished runs", header]
    for b in records.summary():
        held = f"{b['held']}/{b['withInterval']}"
        lines.append(
            f"{b['seen']:>5.0%}  {b['runs']:>4}  {held:>6}  "
            f"{_num(b['coverage'], '.0%'):>8}  {_num(b['medianError'], '+.3f'):>12}  "
            f"{_num(b['medianAbsError'], '.3f'):>14}  {_num(b['medianWidth'], '.3f'):>12}"
        )
    for b in records.summary():
        words = ", ".join(
            f"{word} {c['held']}/{c['withInterval']}" for word, c in b["byConfidence"].items()
        )
        apart = ""
        if b["void"] or b["censored"]:
            reads = ", ".join(f"{r:.3f}" for r in b["censoredReads"])
            apart = (
                f"; {b['void']} void (made for another budget), {b['censored']} censored "
                f"(stopped by their prediction{': read ' + reads if reads else ''})"
            )
        lines.append(f"{b['seen']:>5.0%}  by confidence: {words or '-'}{apart}")
    lines.append(
        "seen: the latest prediction each run made by that fraction of its budget; error: "
        "predicted minus its last evaluation; inside: the prediction's 95 % interval held it; "
        "void and censored predictions are not scored"
    )
    lines += [f"skipped {folder}: {why}" for folder, why in records.skipped.items()]
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plot(records: Records, path: Path) -> Path:
    """A PNG: coverage by fraction seen (against the nominal 95 %), and each run's error by the
    fraction its predictions had seen, with the medians and the median interval's half width."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    coverage_ax, error_ax = fig.subplots(1, 2)
    summary = records.summary()
    _draw_coverage(coverage_ax, summary)
    _draw_errors(error_ax, records, summary)
    try:
        fig.savefig(path, format="png", dpi=110)
    except OSError as err:
        raise InputError(f"{path}: cannot write the plot ({err.strerror or err})") from None
    return path


def _draw_coverage(ax: Axes, summary: list[dict[str, Any]]) -> None:
    seen = [100 * b["seen"] for b in summary]
    heights = [100 * (b["coverage"] or 0.0) for b in summary]
    ax.bar(seen, heights, width=12, color="tab:blue")
    for x, height, b in zip(seen, heights, summary, strict=True):  # how many runs each rests on
        ax.text(x, height + 1, f"{b['held']}/{b['withInterval']}", ha="center", fontsize="small")
    ax.axhline(95, color="gray", linestyle="--", label="nominal 95 %")
    ax.set(xlabel="% of the run seen", ylabel="% of intervals holding the end", ylim=(0, 105))
    ax.set_xticks(seen)
    ax.set_title("coverage")
    ax.legend(loc="lower right", fontsize="small")


def _draw_errors(ax: Axes, records: Records, summary: list[dict[str, Any]]) -> None:
    for name, rows in records.runs.items():
        scored = [r for r in rows if r.get("error") is not None]
        ax.plot(
            [100 * r["fractionSeen"] for r in scored],
            [r["error"] for r in scored],
            marker=".",
            alpha=0.5,
            label=Path(name).name,
        )
    found = [b for b in summary if b["medianError"] is not None]
    seen = [100 * b["seen"] for b in found]
    ax.plot(seen, [b["medianError"] for b in found], "ks-", label="median")
    half = [(b["medianWidth"] or 0.0) / 2 for b in found]
    ax.fill_between(seen, [-h for h in half], half, color="gray", alpha=0.2, label="± half width")
    ax.axhline(0.0, color="gray", linewidth=0.8)
    ax.set(xlabel="% of the run seen", ylabel="predicted - last evaluation", xlim=(0, 100))
    ax.set_title("error of the prediction at the budget")
    # Beside the axes: one entry per run would hide the curves.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="x-small")
