"""Benchmark: are the fit's 95 % intervals 95 %? Backtests on synthetic runs drawn from the law
with the noise our evaluations have.

    .venv/bin/python bench/calibration.py [--draws N] [--seed S] [--runs SEED ... [--work DIR]
        [--length N]]
        [--table1 SEED ...] [--external DIR] [--kept DIR] [--export DIR]

Each scenario is a run's curve (the demo's fit, the paper's Table 1 8B row, and a curve still far
from its asymptote at the run's end). A draw evaluates it every few steps the way a run does:
mean@k over n held-out prompts, each sample a pass with the curve's probability at that compute,
so a point's noise is binomial, sqrt(R (1 - R) / (n k)); a run's held-out prompts differ in
difficulty, which makes its real noise a little smaller than this (a mean of Bernoulli variances
below R (1 - R)), so these draws are no easier than a run's. For each draw the fitter sees

- the first half of the run (by compute), as a user reading the prediction half-way does: does
  its A interval hold the true A, and its band at the run's end the true pass rate there and the
  last evaluation a run would observe?
- the whole run: does its A interval hold the true A?

and the half-run fit's own check (`scalerl.fit.backtest`: its first half, a quarter of the run,
asked what the half-way evaluation would read): how often it says Misfit on runs that follow the
law (a false alarm), and how often the predictive interval holds when it says OK.

Prints, per scenario and fit, the coverage of each nominal 95 % interval (with its binomial
standard error over the draws) and the median width. The target is coverage of at least 90 %
with intervals no wider than needed; a fit that fails counts as a miss and is reported.

Each scenario is backtested twice: every point weighed alike, and every point weighed by its
standard error as a run measures it (binomial from the observed pass rate; `fit_curve(sigma=)`).

`--runs 1 2 3` also makes real local runs, one per seed (an evaluation is seed-locked: one
seed re-reads the same draws every time), of the demo and of chat-arith in one process
(`placement: colocated`, an evaluation every EVERY_STEPS steps), into `--work DIR` (a run
already there is read, not run again), and backtests them as `--kept` does: fitted on the
evaluations of the first half of the run's compute, does the interval for what the last
evaluation will read hold what it read? And what the half-run fit's own check said: the runs it
calls Misfit are those a user was told not to trust. A few minutes per run on 2 cores.
`--length N` makes them N times the examples' budgets, an evaluation every N*EVERY_STEPS steps
(as many evaluations a run), into `name-xN-seed`: runs long enough that their first half reaches
the bend.

`--table1 SEED ...` runs the Table 1 protocol (the law-following synthetic set): each of the ten
curves of the paper's Table 1 with R0 0.25, an evaluation every 100 steps (145 GPU-hours; the two
rows with C_mid ~ 11k GPU-hours proportionally more), Gaussian noise sigma 0.006, fitted on
compute <= 3 C_mid with min_compute 1500 GPU-hours, the forecast and its band at 6 C_mid against
the true curve there: per curve and in total, the largest error, the median band width and the
band's coverage of the truth; the law alone beside it.

`--external DIR` runs the product's half-run backtest (`scalerl.fit.backtest`: fit the
evaluations at compute <= half the last one's, predict the last) on every CSV curve of DIR
(columns compute, pass_rate; no SEs: the noise is read from the first half's residuals), and
`--kept DIR` on the finished runs kept in DIR (`*/history.jsonl`, e.g. a `--work` folder, or the
`*.csv` that `--export DIR` writes of them, as `bench/own-runs` keeps the runs the docs quote; each
evaluation's SE weighs it), without running anything: per curve and in total, predicted,
interval, actual, inside, signed error (predicted - actual) and width. `--draws 0` skips the
synthetic scenarios.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from scalerl.errors import ScaleRLError
from scalerl.fit import FitResult, fit_curve, sample_curve, sigmoid
from scalerl.fit.backtest import Backtest
from scalerl.fit.backtest import backtest as self_check
from scalerl.fit.points import load_curve
from scalerl.runfile import run_command, write_variant


@dataclass(frozen=True)
class Scenario:
    name: str
    A: float
    B: float
    C_mid: float
    R0: float
    end: float  # compute at the run's last evaluation
    evaluations: int  # after step 0, evenly spaced in compute
    prompts: int
    samples: int  # k of mean@k

    def truth(self, compute: np.ndarray) -> np.ndarray:
        return np.asarray(sigmoid(compute, self.A, self.B, self.C_mid, self.R0), dtype=float)

    def noise(self, fit: FitResult) -> float:
        """The standard error of one evaluation at the run's end, as the fit expects it."""
        p = min(max(float(fit.predict(self.end)), 0.0), 1.0)
        return math.sqrt(p * (1 - p) / (self.prompts * self.samples))

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One run's evaluations: compute 0 (step 0) and `evaluations` more up to `end`."""
        compute = np.linspace(0.0, self.end, self.evaluations + 1)
        trials = self.prompts * self.samples
        passes = rng.binomial(trials, self.truth(compute))
        return compute, passes / trials


SCENARIOS = (
    # The demo's fit (make demo: A 1.00, B 1.71, C_mid 0.024, R0 0.19 at 0.071 process-hours;
    # 128 prompts x 8, an evaluation every 10 of 100 steps), with A below the bound.
    Scenario("demo-like", 0.92, 1.71, 0.024, 0.19, 0.071, 10, 128, 8),
    # The paper's ScaleRL 8B row (Table 1), evaluated every 100 steps to 50k GPU-hours, mean@16
    # over 1,000 prompts.
    Scenario("paper-8B", 0.610, 1.92, 2542.0, 0.20, 50_000.0, 60, 1000, 16),
    # A run stopped before its midpoint: the half-run fit sees little of the bend.
    Scenario("early-stop", 0.75, 1.5, 0.05, 0.2, 0.06, 20, 128, 8),
)


@dataclass
class Tally:
    """Hits of one interval over the draws, and its widths."""

    hits: int = 0
    trials: int = 0
    widths: list[float] = field(default_factory=list)

    def add(self, interval: tuple[float, float] | None, value: float) -> None:
        self.trials += 1
        if interval is None:
            return
        self.widths.append(interval[1] - interval[0])
        self.hits += interval[0] <= value <= interval[1]

    def count(self, happened: bool) -> None:
        """A rate rather than a coverage: `hits` counts the draws where it happened."""
        self.trials += 1
        self.hits += happened

    def row(self, label: str) -> str:
        cover = self.hits / self.trials if self.trials else math.nan
        se = math.sqrt(cover * (1 - cover) / self.trials)
        width = statistics.median(self.widths) if self.widths else math.nan
        return f"  {label:<36}{cover:>8.1%} ± {se:>5.1%}{width:>14.4f}"


def backtest(scenario: Scenario, draws: int, seed: int, weighted: bool) -> dict[str, Tally]:
    """Coverage over `draws` runs; `weighted`: each point weighed by its standard error as a run
    measures it (binomial, from the observed pass rate), else all alike."""
    rng = np.random.default_rng(seed)
    labels = (
        "half: A",
        "half: truth at end",
        "half: last eval, curve's band",
        "half: last eval, predictive",
        "half: own check ran",
        "half: said Misfit (false alarm)",
        "half: last eval, predictive, if OK",
        "all: A",
    )
    tallies = {label: Tally() for label in labels}
    failures = 0
    true_end = float(scenario.truth(np.array(scenario.end)))
    for i in range(draws):
        compute, pass_rate = scenario.draw(rng)
        trials = scenario.prompts * scenario.samples
        se = np.sqrt(pass_rate * (1 - pass_rate) / trials) if weighted else None
        half = compute <= scenario.end / 2
        early = _fit(compute[half], pass_rate[half], seed + i, None if se is None else se[half])
        whole = _fit(compute, pass_rate, seed + i, se)
        failures += (early is None) + (whole is None)
        band = early.predict_interval(scenario.end) if early else None
        reads = early.predict_interval(scenario.end, scenario.noise(early)) if early else None
        tallies["half: A"].add(early.A_interval if early else None, scenario.A)
        tallies["half: truth at end"].add(band, true_end)
        tallies["half: last eval, curve's band"].add(band, float(pass_rate[-1]))
        tallies["half: last eval, predictive"].add(reads, float(pass_rate[-1]))
        check = self_check(
            compute[half], pass_rate[half], sigma=None if se is None else se[half], seed=seed + i
        )
        misfit = check is not None and check.inside is False
        tallies["half: own check ran"].count(check is not None)
        tallies["half: said Misfit (false alarm)"].count(misfit)
        if not misfit:
            tallies["half: last eval, predictive, if OK"].add(reads, float(pass_rate[-1]))
        tallies["all: A"].add(whole.A_interval if whole else None, scenario.A)
    if failures:
        print(f"  ({failures} fits of {2 * draws} failed and count as misses)")
    return tallies


def _fit(
    compute: np.ndarray, pass_rate: np.ndarray, seed: int, sigma: np.ndarray | None
) -> FitResult | None:
    try:
        return fit_curve(compute, pass_rate, seed=seed, sigma=sigma)
    except ScaleRLError:
        return None


# (run, C_mid GPU-h, B, A): Table 1 of the paper.
TABLE_1 = (
    ("8B batch 768 14k gen", 2542.0, 1.92, 0.610),
    ("32k thinking", 11272.0, 1.89, 0.645),
    ("8 generations per prompt", 2542.0, 2.44, 0.585),
    ("24 generations per prompt", 3054.0, 2.22, 0.590),
    ("32 generations per prompt", 2936.0, 2.07, 0.595),
    ("Scout 17Bx16 MoE", 4242.0, 1.65, 0.710),
    ("batch 512", 2818.0, 1.77, 0.605),
    ("batch 2048 the 100k run", 10909.0, 1.70, 0.645),
    ("math+code math curve", 2896.0, 2.05, 0.595),
    ("math+code code curve", 1675.0, 1.09, 0.615),
)
TABLE_1_R0 = 0.25
TABLE_1_NOISE = 0.006
TABLE_1_MIN_COMPUTE = 1500.0


def table1_points(c_mid: float, b: float, a: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The protocol's evaluations of one row up to 3 C_mid: every 100 steps (145 GPU-hours, or
    proportionally more for the rows with C_mid ~ 11k), Gaussian noise, R0 0.25."""
    per_eval = 145.0 if c_mid < 5000 else 145.0 * c_mid / 2542.0
    compute = np.arange(0.0, 3 * c_mid + 1e-9, per_eval)
    return compute, sample_curve(compute, a, b, c_mid, TABLE_1_R0, noise=TABLE_1_NOISE, seed=seed)


@dataclass(frozen=True)
class Predicted:
    """One prediction against the truth: the value, its band, and the truth."""

    value: float
    band: tuple[float, float] | None
    truth: float

    @property
    def error(self) -> float:
        return self.value - self.truth

    @property
    def inside(self) -> bool:
        return self.band is not None and self.band[0] <= self.truth <= self.band[1]

    @property
    def width(self) -> float:
        return math.nan if self.band is None else self.band[1] - self.band[0]


def law_alone(fit: FitResult) -> FitResult:
    """The same fit with no drift measured: its forecast is the law."""
    return dataclasses.replace(fit, drift_probe=None)


def table1(seeds: list[int]) -> dict[str, list[Predicted]]:
    """The Table 1 protocol (module text) per seed: the forecast and the law alone at 6 C_mid."""
    print(
        f"law-following synthetic, Table 1 protocol, seeds {seeds}: R0 {TABLE_1_R0}, an "
        "evaluation every 100 steps, "
        f"noise {TABLE_1_NOISE}, fitted on compute <= 3 C_mid with min_compute "
        f"{TABLE_1_MIN_COMPUTE:g}, predicted at 6 C_mid (the curve's 95 % band against the truth)"
    )
    print(
        f"  {'run':<28}{'seed':>5}{'truth':>8}{'forecast':>10}  {'band':<17}{'error':>8}"
        f"{'law':>8}{'law err':>9}  {'model':<10}{'weight':>7}"
    )
    out: dict[str, list[Predicted]] = {"forecast": [], "law": []}
    for seed in seeds:
        for name, c_mid, b, a in TABLE_1:
            compute, pass_rate = table1_points(c_mid, b, a, seed)
            fit = fit_curve(compute, pass_rate, min_compute=TABLE_1_MIN_COMPUTE, seed=seed)
            at = 6 * c_mid
            truth = float(sigmoid(at, a, b, c_mid, TABLE_1_R0))
            forecast = Predicted(float(fit.forecast(at)), fit.predict_interval(at), truth)
            law = law_alone(fit)
            alone = Predicted(float(law.predict(at)), law.predict_interval(at), truth)
            out["forecast"].append(forecast)
            out["law"].append(alone)
            model = getattr(fit, "forecast_model", None)
            chosen = model() if model is not None else {"model": "law+drift", "weight": 1.0}
            lo, hi = forecast.band or (math.nan, math.nan)
            print(
                f"  {name:<28}{seed:>5}{truth:>8.3f}{forecast.value:>10.3f}  "
                f"[{lo:.3f}, {hi:.3f}]{forecast.error:>+8.3f}{alone.value:>8.3f}"
                f"{alone.error:>+9.3f}  {chosen['model']:<10}{chosen['weight']:>7.2f}"
            )
    for label, rows in out.items():
        print(_predicted_total(f"Table 1 protocol, {label}", rows))
    return out


def _predicted_total(label: str, rows: list[Predicted]) -> str:
    errors = [abs(r.error) for r in rows]
    widths = [r.width for r in rows if r.band is not None]
    return (
        f"  {label}: {len(rows)} predictions, largest |error| {max(errors):.3f}, "
        f"{sum(e <= 0.02 for e in errors)} within 0.02; band holds the truth in "
        f"{sum(r.inside for r in rows)} ({sum(r.inside for r in rows) / len(rows):.0%}); "
        f"median width {statistics.median(widths):.4f}"
    )


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REAL_RUNS = {
    "demo": (EXAMPLES / "colocated.yaml", {}),
    "chat-arith": (
        EXAMPLES / "chat-arith.yaml",
        {"placement": "colocated", "generators": {"replicas": 1}, "trainers": {"replicas": 1}},
    ),
}
# A half-run prediction is checked by its own first half, a quarter of the run, which needs
# PREDICTION_MIN_POINTS evaluations past the floor, and its drift by prefix fits of at least
# half its points (scalerl.fit.drift): every 2 of the demo's 100 steps leaves it 12 and 25;
# every 5, 5 and 10, too few to check or to measure a drift (figures in docs/predictions.md).
EVERY_STEPS = 2


def make_runs(seeds: list[int], work: Path, length: int = 1) -> None:
    """Run the demo and chat-arith once per seed into `work` (`name-seed`), colocated, an
    evaluation every EVERY_STEPS steps; a run already there is kept, not run again. `length`
    multiplies the example's budget (and the steps between evaluations, so that each run holds
    as many): `name-xN-seed`."""
    for name, (example, changes) in REAL_RUNS.items():
        budget = yaml.safe_load(example.read_text())["spec"]["budget"]
        for seed in seeds:
            out = work / (f"{name}-{seed}" if length == 1 else f"{name}-x{length}-{seed}")
            if (out / "history.jsonl").exists():
                continue
            longer = {"budget": {"maxSteps": budget["maxSteps"] * length,
                                 "maxComputeHours": budget["maxComputeHours"] * length},
                      "evaluation": {"everySteps": EVERY_STEPS * length}}  # fmt: skip
            spec = write_variant(example, out.with_suffix(".yaml"), changes, {"seed": seed}, longer)
            subprocess.run(run_command(spec, out), check=True, capture_output=True, timeout=3600)


# A curve to backtest: its name, compute, pass rates and their SEs (None: the file has none).
CurveRow = tuple[str, np.ndarray, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class Checked:
    """One curve's half-run backtest (`scalerl.fit.backtest`), as the product runs it, what the
    half-run fit's own check said (its first quarter against its half: what a user reading the
    prediction half-way was told), and the half-run fit's `A >=` bound, if any."""

    name: str
    points: int
    check: Backtest | None  # None: too few points in the first half
    said: str = "-"  # OK / Misfit / - (the half's own check could not run)
    at_least: float | None = None
    law: Backtest | None = None  # the same first-half fit's law alone, without any drift

    def row(self) -> str:
        if self.check is None:
            return f"  {self.name:<58}{self.points:>5}  (first half too short to check)"
        b = self.check
        lo, hi = b.interval if b.interval is not None else (math.nan, math.nan)
        bound = "" if self.at_least is None else f"  A>={self.at_least:.3f}"
        law = ""
        if self.law is not None and self.law.interval is not None:
            llo, lhi = self.law.interval
            law = f"  law {self.law.predicted:.3f} [{llo:.3f}, {lhi:.3f}]"
        model = ""
        chosen = getattr(b.fit, "forecast_model", None)
        if chosen is not None:
            m = chosen()
            model = f"  {m['model']} w {m['weight']:.2f}"
        return (
            f"  {self.name:<58}{self.points:>5}{b.fitted_on:>5}{b.predicted:>10.3f}  "
            f"[{lo:.3f}, {hi:.3f}]{b.actual:>9.3f}  {'yes' if b.inside else 'NO':<4}"
            f"{b.predicted - b.actual:>+8.3f}{hi - lo:>8.3f}  {self.said:<7}{bound}{law}{model}"
        )


def _checked(name: str, c: np.ndarray, y: np.ndarray, se: np.ndarray | None) -> Checked:
    half = c <= c[-1] / 2
    own = self_check(c[half], y[half], sigma=None if se is None else se[half])
    said = "-" if own is None or own.inside is None else "OK" if own.inside else "Misfit"
    check = self_check(c, y, sigma=se)  # its fit is the half-run fit
    at_least = None if check is None or check.fit is None else check.fit.A_at_least
    law = None
    if check is not None and check.fit is not None:
        alone = law_alone(check.fit)
        law = dataclasses.replace(
            check,
            predicted=float(alone.predict(check.compute)),
            interval=alone.predictive_interval(check.compute),
            fit=alone,
        )
    return Checked(name, c.size, check, said, at_least, law)


def check_curves(curves: list[CurveRow]) -> list[Backtest]:
    """The half-run backtest of every curve (name, compute, pass rate, SEs or None): per curve
    and in total, predicted, interval, actual, inside, signed error (predicted - actual), width,
    and what the half-run fit's own check said."""
    print(
        f"  {'curve':<58}{'n':>5}{'half':>5}{'predicted':>10}  {'95 % interval':<16}"
        f"{'actual':>9}  {'in':<4}{'error':>8}{'width':>8}  half said"
    )
    rows = [_checked(*curve) for curve in curves]
    for checked in rows:
        print(checked.row())
    done = [r.check for r in rows if r.check is not None and r.check.interval is not None]
    if not done:
        print("  no curve holds enough points for the check")
        return done
    print(_total(done))
    alone = [r.law for r in rows if r.law is not None and r.law.interval is not None]
    if alone:
        print(_total(alone).replace("total:", "law alone:"))
    return done


def _total(done: list[Backtest]) -> str:
    errors = [b.predicted - b.actual for b in done]
    widths = [b.interval[1] - b.interval[0] for b in done]
    return (
        f"  total: {sum(bool(b.inside) for b in done)} of {len(done)} inside; signed error "
        f"median {statistics.median(errors):+.3f} (mean {statistics.mean(errors):+.3f}), "
        f"median |error| {statistics.median(map(abs, errors)):.3f}; "
        f"median width {statistics.median(widths):.3f}"
    )


def external_curves(folder: Path) -> list[CurveRow]:
    """Every CSV of `folder` (columns compute, pass_rate; published curves carry no SEs: the
    backtest reads the noise from the first half's residuals)."""
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise SystemExit(f"{folder}: no .csv files")
    out: list[CurveRow] = []
    for path in files:
        curve = load_curve(path)
        out.append((path.stem[:58], curve.compute, curve.pass_rate, None))
    return out


def own_runs(folder: Path, curves: list[CurveRow]) -> list[Backtest]:
    """The half-run backtest of the runs kept in `folder` (`kept_runs`), as for the development
    set."""
    print(f"own runs kept in {folder}: half-run backtest, weighted by each evaluation's SE")
    return check_curves(curves)


def kept_runs(folder: Path) -> list[CurveRow]:
    """Every finished run under `folder`, with its SEs: a `history.jsonl` per subfolder (a
    `--work` folder), or a CSV per run as `--export` writes them (`bench/own-runs`)."""
    paths = sorted(folder.glob("*/history.jsonl")) + sorted(folder.glob("*.csv"))
    out: list[CurveRow] = []
    for path in paths:
        curve = load_curve(path)
        se = None if curve.pass_rate_se is None else np.nan_to_num(curve.pass_rate_se, nan=0.0)
        name = path.parent.name if path.name == "history.jsonl" else path.stem
        out.append((name, curve.compute, curve.pass_rate, se))
    return out


def export_runs(curves: list[CurveRow], folder: Path) -> None:
    """Each kept run's evaluations as `folder/name.csv` (compute, pass_rate, pass_rate_se): what
    `--kept` reads, small enough for the repository to keep the runs the docs quote."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, compute, pass_rate, se in curves:
        errors = [None] * compute.size if se is None else [float(e) for e in se]
        with (folder / f"{name}.csv").open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(("compute", "pass_rate", "pass_rate_se"))
            writer.writerows(zip(map(float, compute), map(float, pass_rate), errors, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200, help="runs per scenario (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--runs", type=int, nargs="*", metavar="SEED", help="also backtest real runs, one a seed"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the real runs here; a run already there is read, not run again",
    )
    parser.add_argument(
        "--length",
        type=int,
        default=1,
        metavar="N",
        help=f"--runs: N times the examples' budgets, an evaluation every {EVERY_STEPS}*N steps",
    )
    parser.add_argument(
        "--table1",
        type=int,
        nargs="+",
        metavar="SEED",
        help="the Table 1 protocol (law-following synthetic), one pass per seed",
    )
    parser.add_argument(
        "--external",
        type=Path,
        metavar="DIR",
        help="half-run backtest of every CSV curve (compute, pass_rate) in DIR",
    )
    parser.add_argument(
        "--kept",
        type=Path,
        metavar="DIR",
        help="half-run backtest of the finished runs kept in DIR (its */history.jsonl or *.csv)",
    )
    parser.add_argument(
        "--export",
        type=Path,
        metavar="DIR",
        help="write the own runs' evaluations as DIR/name.csv, which --kept DIR reads again",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    checked: list[Backtest] = []
    external: list[Backtest] = []
    if args.table1:
        table1(args.table1)
    if args.external:
        print(f"development set (the published curves the forecast's rules were tuned on) in "
              f"{args.external}: half-run backtest (fit compute <= half the last, predict the "
              "last)")  # fmt: skip
        external = check_curves(external_curves(args.external))
        checked += external
    with tempfile.TemporaryDirectory() as scratch:
        kept = args.kept
        if args.runs is not None:
            kept = args.work or Path(scratch)
            kept.mkdir(parents=True, exist_ok=True)
            make_runs(args.runs, kept, args.length)
        if kept is not None:
            curves = kept_runs(kept)
            checked += own_runs(kept, curves)
            if args.export:
                export_runs(curves, args.export)
    if not args.kept and args.runs is None:
        print(
            "own runs: none given (--kept DIR: bench/own-runs/x1 and x2 keep the runs the docs "
            "quote; make new ones with --runs 1 2 3 --work DIR)"
        )
    if args.external and len(checked) > len(external):
        print(f"development set and own runs together:\n{_total(checked)}")
    for scenario in SCENARIOS if args.draws else ():  # --draws 0: the curves above only
        noise = math.sqrt(0.25 / (scenario.prompts * scenario.samples))
        print(
            f"law-following synthetic, binomial noise: {scenario.name}: A {scenario.A}, "
            f"B {scenario.B}, C_mid {scenario.C_mid:g}, "
            f"R0 {scenario.R0}; {scenario.evaluations} evaluations to {scenario.end:g}, "
            f"mean@{scenario.samples} over {scenario.prompts} prompts (noise <= {noise:.4f}); "
            f"{args.draws} draws"
        )
        for weighted in (False, True):
            how = "points weighed by their SE" if weighted else "points alike"
            print(f"  {f'nominal 95 % interval, {how}':<36}{'coverage':>17}{'median width':>14}")
            for label, tally in backtest(scenario, args.draws, args.seed, weighted).items():
                print(tally.row(label))
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
