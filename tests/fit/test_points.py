"""Curve files: CSV and JSONL, and one clear line for each kind of bad file."""

from pathlib import Path

import numpy as np
import pytest

from scalerl.errors import DataError
from scalerl.fit import load_curve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "curve.csv"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_with_extra_columns_and_step(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "step,note,compute,pass_rate\n0,a,0,0.2\n100,b,145.5,0.25\n")
    curve = load_curve(path)
    np.testing.assert_array_equal(curve.compute, [0.0, 145.5])
    np.testing.assert_array_equal(curve.pass_rate, [0.2, 0.25])
    np.testing.assert_array_equal(curve.step, [0, 100])
    assert curve.source == str(path) and len(curve) == 2


def test_jsonl_without_step_and_with_blank_lines(tmp_path: Path) -> None:
    text = '{"compute": 0, "pass_rate": 0.2, "run": "x"}\n\n{"compute": 10, "pass_rate": 0.3}\n'
    curve = load_curve(write(tmp_path, "c.jsonl", text))
    np.testing.assert_array_equal(curve.compute, [0.0, 10.0])
    assert curve.step is None


def test_jsonl_is_recognised_without_its_suffix(tmp_path: Path) -> None:
    curve = load_curve(write(tmp_path, "curve.txt", '{"compute": 1, "pass_rate": 0.5}\n'))
    assert curve.pass_rate.tolist() == [0.5]


def test_csv_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffcompute,pass_rate\n1,0.5\n".encode())
    assert load_curve(path).compute.tolist() == [1.0]


def test_the_example_curve_loads() -> None:
    curve = load_curve(EXAMPLE)
    assert curve.compute[0] == 0.0 and len(curve) > 40


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.csv", "", "empty.csv: file is empty"),
        ("header.csv", "compute,pass_rate\n", "header.csv: no data rows"),
        (
            "cols.csv",
            "compute,score\n1,0.5\n",
            "cols.csv:1: missing column 'pass_rate' (header has: compute, score)",
        ),
        (
            "word.csv",
            "compute,pass_rate\n1,0.5\n2,abc\n",
            "word.csv:3: column 'pass_rate': 'abc' is not a number",
        ),
        ("blank.csv", "compute,pass_rate\n1,\n", "blank.csv:2: column 'pass_rate' is empty"),
        (
            "nan.csv",
            "compute,pass_rate\n1,0.5\nnan,0.6\n",
            "nan.csv:3: column 'compute' is nan, not a finite number",
        ),
        ("neg.csv", "compute,pass_rate\n-5,0.5\n", "neg.csv:2: compute -5 is negative"),
        ("big.csv", "compute,pass_rate\n5,1.5\n", "big.csv:2: pass_rate 1.5 is outside [0, 1]"),
        (
            "sort.csv",
            "compute,pass_rate\n0,0.2\n20,0.3\n10,0.4\n",
            "sort.csv:4: compute 10 is smaller than the previous point's 20",
        ),
        ("ragged.csv", "compute,pass_rate\n1,0.5,7\n", "ragged.csv:2: 3 fields, the header has 2"),
        (
            "bad.jsonl",
            '{"compute": 1, "pass_rate": 0.5}\n{"compute": 2,\n',
            "bad.jsonl:2: not valid JSON",
        ),
        ("list.jsonl", "[1, 0.5]\n", "list.jsonl:1: expected a JSON object, got list"),
        ("miss.jsonl", '{"compute": 1}\n', "miss.jsonl:1: missing column 'pass_rate'"),
        (
            "null.jsonl",
            '{"compute": 1, "pass_rate": null}\n',
            "null.jsonl:1: column 'pass_rate': null is not a number",
        ),
        (
            "bool.jsonl",
            '{"compute": true, "pass_rate": 0.5}\n',
            "bool.jsonl:1: column 'compute': true is not a number",
        ),
    ],
)
def test_bad_file_gives_one_line_with_file_line_and_column(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    with pytest.raises(DataError) as caught:
        load_curve(write(tmp_path, name, text))
    shown = str(caught.value)
    assert shown.startswith(f"{tmp_path}/")  # the message names the file first
    assert shown.removeprefix(f"{tmp_path}/").startswith(message)
    assert "\n" not in shown


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.csv: no such file"):
        load_curve(tmp_path / "nope.csv")
    with pytest.raises(DataError, match="is a directory"):
        load_curve(tmp_path)


def test_binary_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DataError, match="not a UTF-8 text file"):
        load_curve(path)
