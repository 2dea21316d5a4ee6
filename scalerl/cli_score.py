"""`scalerl score`: one answer scored against one reference by any reward, so a user can check a
reward on an example before a run. For `code`, the per-test record too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.errors import InputError, ScaleRLError

if TYPE_CHECKING:
    from scalerl.cli_args import Subparsers


def add_score_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "score",
        help="score one answer against one reference with a reward",
        description="Print the reward (+1 / -1) the named reward gives the answer in --answer "
        "for the reference in --reference (the text a data row's answer field holds). For "
        "code, also each test's verdict (passed, wrong answer, runtime error, timeout, "
        "memory, output too large, not run). Exit 0 whatever the reward; 2 for bad input; 1 "
        "when the code sandbox failed (then there is no reward).",
    )
    p.add_argument("--reward", required=True, help="exact | math | code | module:function")
    p.add_argument("--answer", required=True, metavar="FILE", help="the answer text")
    p.add_argument("--reference", required=True, metavar="FILE", help="the reference text")
    p.add_argument("--json", action="store_true", help='print one JSON object {"reward": ...}')
    p.set_defaults(handler=cmd_score)


def cmd_score(args: argparse.Namespace) -> int:
    answer, reference = _read(args.answer, "--answer"), _read(args.reference, "--reference")
    record = _score(args.reward, answer, reference)
    if args.json:
        print(json.dumps(record))
    else:
        _print(record)
    return 1 if record.get("sandbox_error") else 0


def _read(path: str, option: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{option} {path}: {err}") from err


def _score(name: str, answer: str, reference: str) -> dict[str, Any]:
    if name == "code":
        from scalerl.generator.code_reward import score_code

        verdict = score_code(answer, reference)
        record = verdict.to_dict()
        if verdict.error:
            record["reward"] = None
        return record
    from scalerl.generator.rewards import load_reward

    reward = load_reward(name)
    try:
        value = float(reward(answer, reference))
    except ScaleRLError:
        raise
    except Exception as err:  # noqa: BLE001 — a user's reward function failed: say so, briefly
        raise InputError(f"reward {name!r} failed: {type(err).__name__}: {err}") from err
    return {"reward": value}


def _print(record: dict[str, Any]) -> None:
    if record.get("sandbox_error"):
        print(f"no reward: the sandbox failed: {record['sandbox_error']}")
    else:
        print(f"reward {record['reward']:+g}")
    if "tests" not in record:
        return
    print(f"{record['passed']}/{record['total']} tests passed")
    for n, test in enumerate(record["tests"]):
        detail = f": {test['detail'].strip()}" if test["detail"].strip() else ""
        print(f"  test {n}: {test['verdict']} ({test['seconds']:.3f} s){detail}")
    if record["missing_guarantees"]:
        print("sandbox without: " + ", ".join(record["missing_guarantees"]))
