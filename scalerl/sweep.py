"""Runs a ScaleRLSweep on this machine: its variants as `scalerl run` processes, at most
`maxParallel` at once, each fitted as it goes (its own fit.json); a variant that cannot win
(`scalerl.fit.earlystop`, the operator's rule too) is stopped (its checkpoints stay), and at the
end the variants are ranked into leaderboard.json (`scalerl.fit.leaderboard`, the rows of the
operator's status.leaderboard), with every curve in curves.png. SIGTERM or Ctrl-C ends the sweep
the same way: every running variant stopped in order, the leaderboard so far written.

    runs/<sweep>/
      specs/<variant>.yaml   the variant's run (spec.base + its patch)
      <variant>/             the variant's run directory (history, checkpoints, fit.json)
      <variant>.log          its `scalerl run` output
      leaderboard.json       best first, rows of scalerl.fit.leaderboard.ROW_KEYS
      curves.png             every variant's points, fitted curve and band, log compute
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scalerl.fit.earlystop import losers
from scalerl.fit.leaderboard import Evaluations, Standing, board, entry_of
from scalerl.fit.plot import plot_curves
from scalerl.fit.report import FIT_FILE
from scalerl.runfile import run_command
from scalerl.spec import (
    FAILED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    ScaleRLRun,
    ScaleRLSweep,
    load_sweep,
)
from scalerl.status.history import HISTORY_FILE, read_history

log = logging.getLogger("scalerl.sweep")
LEADERBOARD_FILE = "leaderboard.json"
CURVES_FILE = "curves.png"
INTERRUPTED = "the sweep was interrupted"
STOP_GRACE_S = 60.0  # `scalerl run` stops its gang in order (its own grace: 15 s a process)


@dataclass
class Variant:
    name: str
    run: ScaleRLRun
    out: Path  # its run directory
    proc: subprocess.Popen[bytes] | None = None
    phase: str = PENDING
    reason: str | None = None
    evidence: str | None = None  # what decided its early stop: "measured" or "fit"

    def fit(self) -> dict[str, Any] | None:
        """Its latest fit.json (its run refits every fit.everyEvaluations), or None."""
        try:
            return dict(json.loads((self.out / FIT_FILE).read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def standing(self) -> Standing:
        """What the leaderboard and the early stop see of it: its history and fit.json."""
        path = self.out / HISTORY_FILE
        rows = read_history(path) if path.exists() else []
        evaluations = Evaluations.from_rows(
            rows,
            compute="compute",
            pass_rate="pass_rate",
            se="pass_rate_se",
            excluded="fit_excluded",
        )
        return Standing(
            name=self.name,
            run=self.run,
            phase=self.phase,
            evaluations=evaluations,
            prediction=self.fit(),
            stop_reason=self.reason if self.phase == STOPPED else None,
            stop_evidence=self.evidence,
            failure=self.reason if self.phase == FAILED else None,
        )


class Interrupted(Exception):
    """The sweep was ended by a signal; its variants were stopped and `board` written."""

    def __init__(self, signum: int, board: list[dict[str, Any]]) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"sweep stopped by {name}: every running variant stopped, checkpoints kept"
        )
        self.signum, self.board = signum, board


def run_sweep(path: Path, out: Path | None = None, *, poll_s: float = 2.0) -> list[dict[str, Any]]:
    """Run the sweep in `path` into `out` (default runs/<sweep>); the leaderboard, best first.
    SIGTERM or Ctrl-C (SIGINT) stops every running variant in order, writes the leaderboard so
    far, and raises Interrupted; the same call again resumes the variants from their
    checkpoints."""
    sweep = load_sweep(path)
    out = out or Path("runs") / sweep.name
    (out / "specs").mkdir(parents=True, exist_ok=True)
    variants = [Variant(name, run, out / name) for name, run in sweep.variant_runs().items()]
    received: list[int] = []
    with _signals_noted(received):
        try:
            while any(v.phase in (PENDING, RUNNING) for v in variants) and not received:
                start_due(sweep, variants, out)
                reap(variants)
                stop_losers(sweep, variants)
                time.sleep(poll_s)
        except KeyboardInterrupt:  # a SIGINT that arrived before our handler, or re-raised
            received.append(signal.SIGINT)
        finally:
            for variant in variants:
                if variant.phase == RUNNING:
                    stop(variant, INTERRUPTED)
        board = write_leaderboard(variants, out)
    if received:
        raise Interrupted(received[0], board)
    return board


@contextmanager
def _signals_noted(received: list[int]) -> Iterator[None]:
    """While the sweep runs, SIGTERM and SIGINT are noted in `received` (the loop then ends and
    the variants are stopped in order) instead of ending this process midway."""

    def note(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start_due(sweep: ScaleRLSweep, variants: list[Variant], out: Path) -> None:
    """Start pending variants, in order, while fewer than maxParallel run."""
    running = sum(v.phase == RUNNING for v in variants)
    for variant in variants:
        if running >= sweep.spec.max_parallel:
            return
        if variant.phase != PENDING:
            continue
        spec_path = out / "specs" / f"{variant.name}.yaml"
        # Nulls kept: a null is a choice (thinkEnd: null is a model that does not think).
        document = variant.run.model_dump(by_alias=True, mode="json")
        spec_path.write_text(yaml.safe_dump(document, sort_keys=False))
        with (out / f"{variant.name}.log").open("ab") as log_file:
            variant.proc = subprocess.Popen(
                run_command(spec_path, variant.out),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its Ctrl-C is ours to send (stop)
            )
        variant.phase = RUNNING
        running += 1
        log.info("variant %s started", variant.name)


def reap(variants: list[Variant]) -> None:
    """Variants whose run ended: Succeeded (it reached its budget) or Failed."""
    for variant in variants:
        if variant.phase != RUNNING or variant.proc is None:
            continue
        code = variant.proc.poll()
        if code is None:
            continue
        variant.phase = SUCCEEDED if code == 0 else FAILED
        if code != 0:
            variant.reason = f"scalerl run exited with {code} (see {variant.name}.log)"


def stop_losers(sweep: ScaleRLSweep, variants: list[Variant]) -> None:
    """Stop the running variants that cannot win (`scalerl.fit.earlystop`)."""
    rule = sweep.spec.early_stop
    if rule is None:
        return
    standings = [v.standing() for v in variants if v.phase != PENDING]
    for name, verdict in losers(standings, rule.min_points).items():
        variant = next(v for v in variants if v.name == name)
        if variant.phase == RUNNING:
            stop(variant, verdict.reason, verdict.evidence)


def stop(variant: Variant, reason: str, evidence: str | None = None) -> None:
    """Stop a running variant as Ctrl-C stops `scalerl run`: its gang stops, its checkpoints
    stay (the same command resumes it). SIGTERM, which `scalerl run` handles as Ctrl-C, and not
    SIGINT: a process started with SIGINT ignored (any background job of a non-interactive
    shell, as CI runs us) keeps it ignored, and such a variant ran on until the grace period's
    SIGKILL."""
    assert variant.proc is not None
    try:
        os.killpg(variant.proc.pid, signal.SIGTERM)
        variant.proc.wait(STOP_GRACE_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(variant.proc.pid, signal.SIGKILL)
        variant.proc.wait()
    variant.phase, variant.reason, variant.evidence = STOPPED, reason, evidence
    log.info("variant %s stopped: %s", variant.name, reason)


def write_leaderboard(variants: list[Variant], out: Path) -> list[dict[str, Any]]:
    """Refit every variant's whole history, rank them, write leaderboard.json and curves.png."""
    standings = [v.standing() for v in variants]
    entries = [entry_of(s) for s in standings]
    rows = board(standings, entries)
    (out / LEADERBOARD_FILE).write_text(json.dumps(rows, indent=2) + "\n")
    plot_curves([(e.name, e.fit, e.compute, e.pass_rate) for e in entries], out / CURVES_FILE)
    return rows
