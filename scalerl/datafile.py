"""Records from a data file: JSON Lines (one object per line) or Parquet (one object per row).

Every problem is a DataError of one line that names the file first, and the line or row when there
is one: `FILE: no such file`, `FILE:LINE: not valid JSON (...)`. pyarrow is imported only when a
Parquet file is read, so light callers (the fitter, the CLI) stay light.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalerl.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")

Record = dict[str, Any]


def read_records(path: Path) -> Iterator[tuple[int, Record]]:
    """(line or row number from 1, record) of a Parquet file (by its suffix) or a JSONL file."""
    if path.suffix in PARQUET_SUFFIXES:
        return parquet_records(path)
    return jsonl_records(path, read_text(path))


def read_text(path: Path) -> str:
    """The text of a UTF-8 file, without the byte-order mark spreadsheets often write first."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a data file") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None


def jsonl_records(path: Path, text: str) -> Iterator[tuple[int, Record]]:
    """(line number, object) of each non-blank line of `text`, read from `path`."""
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{line}: not valid JSON ({err.msg})") from None
        except (ValueError, RecursionError) as err:  # an integer of > 4300 digits, deep nesting
            raise DataError(f"{path}:{line}: not usable JSON ({err})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{line}: expected a JSON object, got {type(record).__name__}")
        yield line, record


def parquet_records(path: Path) -> Iterator[tuple[int, Record]]:
    """(row number, row as an object) of a Parquet file."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: cannot read Parquet ({err})") from None
    rows: list[Record] = table.to_pylist()
    return enumerate(rows, start=1)
