"""Evaluation points of a run — (compute, pass_rate[, step]) — read from CSV or JSONL and checked.

Every problem is reported as one line that says where it is: `FILE:LINE: column 'x': ...` for
files, `point N: ...` for arrays handed to the fitter directly.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scalerl.datafile import jsonl_records, read_text
from scalerl.errors import DataError

REQUIRED = ("compute", "pass_rate")
# A history.jsonl row's standard error and time of the evaluation (weights, wall pace) are read too.
OPTIONAL = ("step", "pass_rate_se", "time")
# And why the fit leaves an evaluation out (scalerl.status.history: too many unscored samples):
# text, empty or absent for an evaluation that is fitted.
FIT_EXCLUDED = "fit_excluded"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class Columns:
    """The names an evaluation's numbers have in a list of rows."""

    compute: str
    pass_rate: str
    se: str
    time: str  # unix seconds of the evaluation's end
    # Each domain's {pass rate, se} under these same names, in a run of several domains.
    by_domain: str = ""
    # Why the fit leaves an evaluation out (too many unscored samples); absent or empty: fitted.
    excluded: str = ""


# history.jsonl (and curve files), status.evaluations
HISTORY = Columns(
    "compute", "pass_rate", "pass_rate_se", "time", "pass_rate_by_domain", FIT_EXCLUDED
)
STATUS = Columns("computeHours", "passRate", "passRateSE", "time", "byDomain", "fitExcluded")


@dataclass(frozen=True)
class Curve:
    """A run's evaluations, sorted by compute. An optional column (`step`, `pass_rate_se`,
    `time`) is None when no row of the file has it."""

    compute: NDArray[np.float64]
    pass_rate: NDArray[np.float64]
    step: NDArray[np.float64] | None = None
    source: str = "<arrays>"
    pass_rate_se: NDArray[np.float64] | None = None
    time: NDArray[np.float64] | None = None
    # Each point's reason to be left out of the fit ("" where it is fitted); None: no row has one.
    fit_excluded: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return int(self.compute.size)

    def rows(self) -> list[dict[str, float | str]]:
        """One dict per point, named as history.jsonl names them; a column a row lacks is left
        out of it."""
        columns = {"compute": self.compute, "pass_rate": self.pass_rate}
        for name in OPTIONAL:
            if (values := getattr(self, name)) is not None:
                columns[name] = values
        rows: list[dict[str, float | str]] = [
            {name: float(v[i]) for name, v in columns.items() if not math.isnan(v[i])}
            for i in range(len(self))
        ]
        for row, reason in zip(rows, self.fit_excluded or (), strict=False):
            if reason:
                row[FIT_EXCLUDED] = reason
        return rows


def check_points(
    compute: ArrayLike,
    pass_rate: ArrayLike,
    where: Callable[[int], str] = lambda i: f"point {i}",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validated float copies of `compute` and `pass_rate`, or a DataError naming the bad point.

    `where(i)` names point i in messages (a file and line for loaded files).
    """
    c, r = _as_floats(compute, "compute"), _as_floats(pass_rate, "pass_rate")
    if c.ndim != 1 or r.ndim != 1 or c.size != r.size:
        raise DataError(
            "compute and pass_rate must be 1-D and of equal length, "
            f"got shapes {c.shape} and {r.shape}"
        )
    if c.size == 0:
        raise DataError("no points")
    for name, values in (("compute", c), ("pass_rate", r)):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise DataError(
                f"{where(int(bad[0]))}: {name} is {values[bad[0]]}, not a finite number"
            )
    _check_ranges(c, r, where)
    return c, r


def _as_floats(values: ArrayLike, name: str) -> NDArray[np.float64]:
    """A float copy, or a DataError: numpy raises TypeError/ValueError for strings, ragged lists
    and the like, and a fitter must answer those with a reason, not a traceback."""
    try:
        with warnings.catch_warnings():
            # Complex input would be cast with only a warning, silently dropping the imaginary part.
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            return np.array(values, dtype=float)
    except (TypeError, ValueError, OverflowError, np.exceptions.ComplexWarning) as err:
        raise DataError(f"{name} is not an array of numbers ({err})") from None


def _check_ranges(
    c: NDArray[np.float64], r: NDArray[np.float64], where: Callable[[int], str]
) -> None:
    negative = np.flatnonzero(c < 0)
    if negative.size:
        i = int(negative[0])
        raise DataError(f"{where(i)}: compute {c[i]:g} is negative")
    outside = np.flatnonzero((r < 0) | (r > 1))
    if outside.size:
        i = int(outside[0])
        raise DataError(f"{where(i)}: pass_rate {r[i]:g} is outside [0, 1]")
    # Ties are allowed (repeated evaluations at one checkpoint); going back in compute is not.
    backwards = np.flatnonzero(np.diff(c) < 0)
    if backwards.size:
        i = int(backwards[0]) + 1
        raise DataError(
            f"{where(i)}: compute {c[i]:g} is smaller than the previous point's {c[i - 1]:g}; "
            "points must be sorted by increasing compute"
        )


def standard_errors(rows: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    """Each evaluation's standard error (`key` of every row), for a fit weighted by them; None
    when one lacks it (an older history): a partial set would weigh the others wrongly."""
    values = [row.get(key) for row in rows]
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return numbers if values and len(numbers) == len(values) else None


def load_curve(path: str | Path) -> Curve:
    """Read a curve file: CSV with a header row, or JSON Lines (one object per line).

    Columns `compute` and `pass_rate` are required, `step` is optional, others are ignored. The
    format follows the suffix (.csv; .jsonl/.ndjson/.json); otherwise a first character `{` means
    JSONL.
    """
    path = Path(path)
    text = read_text(path)
    if not text.strip():
        raise DataError(f"{path}: file is empty")
    rows = _jsonl_rows(path, text) if _is_jsonl(path, text) else _csv_rows(path, text)
    try:
        records = list(rows)
    except csv.Error as err:  # a NUL byte, a field beyond csv's size limit
        raise DataError(f"{path}: not a readable CSV file ({err})") from None
    if not records:
        raise DataError(f"{path}: no data rows")
    lines = [line for line, _, _ in records]
    columns = np.array([values for _, values, _ in records], dtype=float)
    reasons = tuple(reason for _, _, reason in records)

    def where(i: int) -> str:
        return f"{path}:{lines[i]}"

    compute, pass_rate = check_points(columns[:, 0], columns[:, 1], where)
    optional = {
        name: columns[:, 2 + i] if not np.isnan(columns[:, 2 + i]).all() else None
        for i, name in enumerate(OPTIONAL)
    }
    return Curve(
        compute=compute,
        pass_rate=pass_rate,
        source=str(path),
        fit_excluded=reasons if any(reasons) else None,
        **optional,
    )


def _is_jsonl(path: Path, text: str) -> bool:
    if path.suffix.lower() in JSONL_SUFFIXES:
        return True
    return path.suffix.lower() != ".csv" and text.lstrip().startswith("{")


# line, (compute, pass_rate, *OPTIONAL: nan where absent), why the fit leaves it out ("": it does)
Row = tuple[int, tuple[float, ...], str]


def _csv_rows(path: Path, text: str) -> Iterator[Row]:
    reader = csv.reader(text.splitlines())
    header = [name.strip() for name in next(reader)]
    index = {name: i for i, name in enumerate(header)}
    missing = [name for name in REQUIRED if name not in index]
    if missing:
        raise DataError(
            f"{path}:1: missing column {', '.join(repr(m) for m in missing)} "
            f"(header has: {', '.join(header) or 'nothing'})"
        )
    for cells in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            raise DataError(f"{path}:{line}: {len(cells)} fields, the header has {len(header)}")
        row = {name: cells[i] for name, i in index.items()}
        yield line, _row_values(path, line, row), _reason(path, line, row.get(FIT_EXCLUDED))


def _jsonl_rows(path: Path, text: str) -> Iterator[Row]:
    for line, obj in jsonl_records(path, text):
        missing = [name for name in REQUIRED if name not in obj]
        if missing:
            raise DataError(f"{path}:{line}: missing column {', '.join(repr(m) for m in missing)}")
        yield line, _row_values(path, line, obj), _reason(path, line, obj.get(FIT_EXCLUDED))


def _reason(path: Path, line: int, value: Any) -> str:
    """A row's FIT_EXCLUDED: its text, "" when absent, null or empty (the row is fitted)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{path}:{line}: column {FIT_EXCLUDED!r}: {json.dumps(value)} is not text")
    return value.strip()


def _row_values(path: Path, line: int, row: dict[str, Any]) -> tuple[float, ...]:
    required = tuple(_number(path, line, name, row[name]) for name in REQUIRED)
    optional = tuple(
        _number(path, line, name, row[name]) if row.get(name) not in (None, "") else math.nan
        for name in OPTIONAL
    )
    return required + optional


def _number(path: Path, line: int, column: str, value: Any) -> float:
    """A float from a CSV cell (str) or a JSON value; NaN and inf pass here and fail in checks."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise DataError(f"{path}:{line}: column {column!r}: {json.dumps(value)} is not a number")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except OverflowError:  # a JSON integer beyond the float range
        raise DataError(f"{path}:{line}: column {column!r}: number too large") from None
    except ValueError:
        shown = value.strip() if isinstance(value, str) else value
        raise DataError(
            f"{path}:{line}: column {column!r}: {shown!r} is not a number"
            if shown != ""
            else f"{path}:{line}: column {column!r} is empty"
        ) from None
    if not math.isfinite(number):
        raise DataError(f"{path}:{line}: column {column!r} is {number}, not a finite number")
    return number
