"""Runs a ScaleRLSweep on this machine: its variants as `scalerl run` processes, at most
`maxParallel` at once, each fitted as it goes (its own fit.json); a variant whose A interval lies
wholly below the best variant's is stopped (its checkpoints stay), and at the end the variants are
ranked the paper's way into leaderboard.json, with every curve in curves.png.

    runs/<sweep>/
      specs/<variant>.yaml   the variant's run (spec.base + its patch)
      <variant>/             the variant's run directory (history, checkpoints, fit.json)
      <variant>.log          its `scalerl run` output
      leaderboard.json       best first: name, phase, A and interval, B, C_mid, compute, stop
      curves.png             every variant's points, fitted curve and band, log compute
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scalerl.errors import ScaleRLError
from scalerl.fit.fitter import fit_curve
from scalerl.fit.leaderboard import Entry, losers, rank
from scalerl.fit.plot import plot_curves
from scalerl.fit.points import standard_errors
from scalerl.fit.report import FIT_FILE
from scalerl.runfile import run_command
from scalerl.spec import ScaleRLRun, ScaleRLSweep, load_sweep
from scalerl.status.history import HISTORY_FILE, read_history

log = logging.getLogger("scalerl.sweep")
LEADERBOARD_FILE = "leaderboard.json"
CURVES_FILE = "curves.png"
PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED = (
    "Pending",
    "Running",
    "Succeeded",
    "Failed",
    "Stopped",
)
STOP_GRACE_S = 60.0  # `scalerl run` stops its gang in order (its own grace: 15 s a process)


@dataclass
class Variant:
    name: str
    run: ScaleRLRun
    out: Path  # its run directory
    proc: subprocess.Popen[bytes] | None = None
    phase: str = PENDING
    reason: str | None = None

    def fit(self) -> dict[str, Any] | None:
        """Its latest fit.json (its run refits every fit.everyEvaluations), or None."""
        try:
            return dict(json.loads((self.out / FIT_FILE).read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def history(self) -> tuple[np.ndarray, np.ndarray, list[float] | None]:
        """Its evaluations: compute, pass rate, and their standard errors (None: some lack one)."""
        rows = read_history(self.out / HISTORY_FILE) if (self.out / HISTORY_FILE).exists() else []
        return (
            np.array([r["compute"] for r in rows], dtype=float),
            np.array([r["pass_rate"] for r in rows], dtype=float),
            standard_errors(rows, "pass_rate_se"),
        )


def run_sweep(path: Path, out: Path | None = None, *, poll_s: float = 2.0) -> list[dict[str, Any]]:
    """Run the sweep in `path` into `out` (default runs/<sweep>); the leaderboard, best first."""
    sweep = load_sweep(path)
    out = out or Path("runs") / sweep.name
    (out / "specs").mkdir(parents=True, exist_ok=True)
    variants = [Variant(name, run, out / name) for name, run in sweep.variant_runs().items()]
    try:
        while any(v.phase in (PENDING, RUNNING) for v in variants):
            start_due(sweep, variants, out)
            reap(variants)
            stop_losers(sweep, variants)
            time.sleep(poll_s)
    finally:
        for variant in variants:
            if variant.phase == RUNNING:
                stop(variant, "the sweep was interrupted")
    return write_leaderboard(variants, out)


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
    rule = sweep.spec.early_stop
    if rule is None:
        return
    fits = {v.name: fit for v in variants if v.phase != PENDING and (fit := v.fit()) is not None}
    for name, reason in losers(fits, rule.min_points).items():
        variant = next(v for v in variants if v.name == name)
        if variant.phase == RUNNING:
            stop(variant, reason)


def stop(variant: Variant, reason: str) -> None:
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
    variant.phase, variant.reason = STOPPED, reason
    log.info("variant %s stopped: %s", variant.name, reason)


def write_leaderboard(variants: list[Variant], out: Path) -> list[dict[str, Any]]:
    """Refit every variant's whole history, rank them, write leaderboard.json and curves.png."""
    entries = {v.name: entry_of(v) for v in variants}
    board = [
        row(next(v for v in variants if v.name == e.name), e) for e in rank([*entries.values()])
    ]
    (out / LEADERBOARD_FILE).write_text(json.dumps(board, indent=2) + "\n")
    plot_curves(
        [(e.name, e.fit, e.compute, e.pass_rate) for e in entries.values()], out / CURVES_FILE
    )
    return board


def entry_of(variant: Variant) -> Entry:
    compute, pass_rate, sigma = variant.history()
    try:
        fit = fit_curve(
            compute, pass_rate, min_compute=variant.run.spec.fit.min_compute, sigma=sigma
        )
    except ScaleRLError:  # too few points (a variant stopped or failed early)
        fit = None
    return Entry(variant.name, fit, compute, pass_rate)


def row(variant: Variant, entry: Entry) -> dict[str, Any]:
    """One line of the leaderboard."""
    fit = entry.fit
    compute = float(entry.compute[-1]) if entry.compute.size else 0.0
    saved = None
    if variant.phase == STOPPED:  # what its budget would have spent beyond where it stopped
        last_step = int((variant.fit() or {}).get("lastStep") or 0)
        end, _ = variant.run.spec.budget.end(last_step, compute)
        saved = max(0.0, end - compute)
    return {
        "name": variant.name,
        "run": variant.run.name,
        "phase": variant.phase,
        "A": None if fit is None else fit.A,
        "A_interval": None if fit is None or fit.A_interval is None else list(fit.A_interval),
        "B": None if fit is None else fit.B,
        "C_mid": None if fit is None else fit.C_mid,
        "points": None if fit is None else fit.points,
        "compute": compute,
        "stopReason": variant.reason if variant.phase == STOPPED else None,
        "failure": variant.reason if variant.phase == FAILED else None,
        "computeSaved": saved,
    }
