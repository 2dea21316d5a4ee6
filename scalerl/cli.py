"""The `scalerl` command line.

Each command is a pair: `add_<name>_parser(subparsers)` declares its arguments and points
`handler` at `cmd_<name>(args) -> int`. Handlers import what they need when they run, so
`scalerl --help` and unrelated commands stay fast. `main` is the one top-level error handler: a
ScaleRLError becomes `error: <message>` on stderr and its exit code; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from scalerl.errors import FitError, InputError, ScaleRLError, report

if TYPE_CHECKING:
    from scalerl.fit import Curve, FitResult
    from scalerl.fit.report import FitReport

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

N = TypeVar("N", int, float)  # what an argparse type below reads


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (0 ok, 2 bad input, 1 other failures)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse reports usage errors (2) and --help (0) by exiting
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 2
    try:
        return int(args.handler(args))
    except ScaleRLError as err:
        return report(err)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: one line, no traceback
        print(str(stop) or "interrupted", file=sys.stderr)
        return 128 + int(getattr(stop, "signum", 2))  # as a shell reports it: 130, 143


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalerl",
        description="ScaleRL post-training runs and their scaling-curve predictions.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in COMMANDS:
        add_parser(subparsers)
    return parser


# --- scalerl fit -----------------------------------------------------------------------------


def add_fit_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "fit",
        help="fit the sigmoidal scaling law to a run's evaluations",
        description="Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to a curve file: CSV with a "
        "header row or JSONL, columns compute and pass_rate (step optional, others ignored), "
        "sorted by compute. With --run, the evaluations in a ScaleRLRun's status instead; the "
        "prediction goes back into its status (the operator's fit Job).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", help="curve file (.csv or .jsonl)")
    source.add_argument(
        "--run",
        metavar="NAME",
        help="fit the ScaleRLRun NAME's status.evaluations and write status.prediction "
        "(connects as kubectl does); exit 0 also when no fit could be made (the run's "
        "Predicted condition says why), 2 when the run cannot be read",
    )
    p.add_argument("--namespace", metavar="NS", help="namespace of --run (default: the context's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="PNG", help="write a plot of the fit to this PNG file")
    p.add_argument(
        "--predict-at",
        metavar="C",
        type=_compute_value,
        nargs="+",
        action="extend",
        default=[],
        help="predict the pass rate at these compute values",
    )
    _add_fit_options(p)
    p.set_defaults(handler=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    from scalerl.fit import plot_fit

    if args.run is not None:
        return cmd_fit_run(args)
    curve, fitted = _fit_file(args.file, args)
    result = fitted.result
    predicted = [_prediction(result, c) for c in args.predict_at]
    if args.plot:
        horizon = max(args.predict_at) if args.predict_at else None
        plot_fit(result, curve.compute, curve.pass_rate, args.plot, predict_to=horizon)
    if args.json:
        out = {"file": args.file, **fitted.to_dict(), "predicted": predicted}
        if args.plot:
            out["plot"] = args.plot
        print(json.dumps(out))
    else:
        print(_fit_summary(args.file, curve, fitted, predicted, args.target))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


# --- scalerl compare -------------------------------------------------------------------------


def add_compare_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="which of two runs scales better (the paper's rule)",
        description="Fit both curves. If their asymptotes A differ by more than 0.02 the higher A "
        "wins; otherwise both are refitted with A fixed at their mean and the higher B wins.",
    )
    p.add_argument("file_a", metavar="FILE_A", help="curve file of run a")
    p.add_argument("file_b", metavar="FILE_B", help="curve file of run b")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_fit_options(p)
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from scalerl.fit import compare

    curve_a, report_a = _fit_file(args.file_a, args)
    curve_b, report_b = _fit_file(args.file_b, args)
    fit_a, fit_b = report_a.result, report_b.result
    result = compare(
        fit_a, fit_b, (curve_a.compute, curve_a.pass_rate), (curve_b.compute, curve_b.pass_rate)
    )
    verdict = result.verdict(args.file_a, args.file_b)
    if args.json:
        files = {"a": args.file_a, "b": args.file_b}
        print(
            json.dumps(
                {
                    "a": {"file": args.file_a, **fit_a.to_dict()},
                    "b": {"file": args.file_b, **fit_b.to_dict()},
                    **result.to_dict(),
                    "winner_file": files.get(result.winner),
                    "verdict": verdict,
                }
            )
        )
    else:
        width = max(len(args.file_a), len(args.file_b))
        for label, path, fit in (("a", args.file_a, fit_a), ("b", args.file_b, fit_b)):
            print(f"{label}  {path:<{width}}  {_one_line(fit)}")
        print(f"verdict: {verdict}")
    return 0


# --- shared pieces ---------------------------------------------------------------------------


def _add_fit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--min-compute",
        metavar="X",
        type=_compute_value,
        default=None,
        help="exclude points below this compute from the fit (default: 3%% of the largest "
        "compute; the paper excludes ~1.5k of 50k GPU-hours)",
    )
    p.add_argument(
        "--r0",
        choices=("fixed", "fit"),
        default="fixed",
        help="fixed: R0 is the pass rate at the smallest compute (default); fit: a free parameter",
    )
    p.add_argument(
        "--bootstrap",
        metavar="N",
        type=_replicates,
        default=200,
        help=f"bootstrap replicates for the intervals (default 200, at least {MIN_BOOTSTRAP}; "
        "0 skips them)",
    )
    p.add_argument(
        "--budget",
        metavar="C",
        type=_positive_compute,
        default=None,
        help="the compute the run will end at, for predictedAtBudget and its interval "
        "(default: the last point's)",
    )
    p.add_argument(
        "--target",
        metavar="R",
        type=_pass_rate,
        default=None,
        help="a pass rate to reach: the compute at which the curve reaches it (computeToTarget)",
    )
    p.add_argument("--seed", metavar="S", type=int, default=0, help="bootstrap seed (default 0)")


def _fit_file(path: str, args: argparse.Namespace) -> tuple[Curve, FitReport]:
    """The file's curve and its fit as fit.json has it (`fit_report`: weighted by the file's
    pass_rate_se where every row has one, the outlook at --budget, the half-run backtest)."""
    from scalerl.fit import load_curve
    from scalerl.fit.report import fit_report
    from scalerl.spec import MAX_STEPS, BudgetSpec

    curve = load_curve(path)
    last = float(curve.compute[-1])
    # Built without the spec's bounds: a file's compute may be in any unit, of any size.
    budget = BudgetSpec.model_construct(
        max_steps=MAX_STEPS,
        max_compute_hours=args.budget if args.budget is not None else last or 1.0,
        target_pass_rate=args.target,
        stop_when=None,
    )
    try:
        fitted = fit_report(
            curve.rows(),
            min_compute=args.min_compute,
            budget=budget,
            units=None,  # a file's compute has no known rate: etaSeconds only from its times
            r0=args.r0,
            bootstrap=args.bootstrap,
            seed=args.seed,
        )
    except FitError as err:
        raise FitError(f"{path}: {err}") from None
    return curve, fitted


def _prediction(result: FitResult, compute: float) -> dict[str, Any]:
    """The curve at `compute`, its band, and what an evaluation there would read."""
    out: dict[str, Any] = {"compute": compute, "pass_rate": result.predict(compute)}
    band, reads = result.predict_interval(compute), result.predictive_interval(compute)
    out["curveInterval"] = None if band is None else list(band)
    out["evaluationInterval"] = None if reads is None else list(reads)
    return out


FILE_UNIT = "in the file's units"  # a curve file's compute has no unit we know


def _fit_summary(
    path: str,
    curve: Curve,
    fitted: FitReport,
    predicted: list[dict[str, Any]],
    target: float | None = None,
) -> str:
    result = fitted.result
    level = f"{round(100 * result.level)}% interval"

    def row(name: str, value: str, interval: tuple[float, float] | None, fmt: str) -> str:
        tail = f"   {level} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]" if interval else ""
        return f"  {name:<6} {value:>8}{tail}"

    lines = [
        f"{path}: fitted {result.points} trained points (compute > 0), {result.excluded} below "
        f"min_compute {result.min_compute:.4g} excluded, R0 {_R0_MODES[result.r0_mode]}; "
        "compute in the file's units",
        row("A", f"{result.A:.4f}", result.A_interval, ".4f"),
        row("B", f"{result.B:.3f}", result.B_interval, ".3f"),
        row("C_mid", f"{result.C_mid:.4g}", result.C_mid_interval, ".4g"),
        row("R0", f"{result.R0:.4f}", None, ""),
    ]
    if result.A_at_least is not None:
        lines.append(f"  A >= {result.A_at_least:.4f}: the points bound it from below only")
    if _falls(curve, result):
        lines.append(
            "  the curve falls: it ends below where it started (R0), and the law, a rise from "
            "R0 to A, does not fit it"
        )
    for p in predicted:
        lines.append(_predicted_line(p))
    if target is not None:
        lines.append(f"  {_target_words(fitted.outlook, FILE_UNIT, target)[2:]}")
    lines.append(_confidence_line(fitted.outlook))
    if result.bootstrap_failed:
        lines.append(_bootstrap_note(result))
    return "\n".join(lines)


def _falls(curve: Curve, result: FitResult) -> bool:
    """Whether the later half of the trained points lies below R0 by more than two standard
    errors of its mean: a falling run, which the law (a rise from R0 to A) cannot follow. One
    point's noise: the file's pass_rate_se, else the scatter of successive differences (the
    fit's residuals would count the fall itself as noise)."""
    import numpy as np

    trained = curve.compute > 0
    y = curve.pass_rate[trained]
    late = y[y.size // 2 :]
    if late.size < 2:
        return False
    if curve.pass_rate_se is not None:
        noise = float(np.mean(curve.pass_rate_se[trained][y.size // 2 :]))
    else:
        noise = float(np.std(np.diff(y), ddof=1)) / math.sqrt(2.0)
    return bool(result.R0 - float(np.mean(late)) > 2 * noise / math.sqrt(late.size))


def _predicted_line(p: dict[str, Any]) -> str:
    """The curve at a compute with its band, and the wider interval an evaluation would read."""
    curve, reads = p["curveInterval"], p["evaluationInterval"]
    band = f" [{curve[0]:.4f}, {curve[1]:.4f}]" if curve else ""
    evaluation = (
        f"; an evaluation there would read [{reads[0]:.4f}, {reads[1]:.4f}]" if reads else ""
    )
    return f"  at compute {p['compute']:.6g}: curve {p['pass_rate']:.4f}{band}{evaluation}"


def _confidence_line(outlook: dict[str, Any]) -> str:
    """What is known of the fit, in fit.json's words."""
    return f"  confidence{_confidence_words(outlook)[1:]}"


def _confidence_words(fit: dict[str, Any]) -> str:
    """'; <confidence>: <why>' (a Misfit's: `misfit_note`), '' for a fit without a confidence."""
    from scalerl.operator.prediction import misfit_note

    confidence = fit.get("confidence")
    if confidence == "Misfit":
        return misfit_note(fit)
    if confidence is None:
        return ""
    return f"; {confidence}: {fit.get('confidenceReason') or 'the half-run check held'}"


def _bootstrap_note(result: FitResult) -> str:
    """Say how many bootstrap refits failed: the intervals rest on the others only."""
    failed, total = result.bootstrap_failed, result.bootstrap_failed + result.draws.shape[0]
    if failed == total:
        return f"  all {total} bootstrap replicates failed to refit: no intervals"
    return f"  {failed} of {total} bootstrap replicates failed to refit and were dropped"


_R0_MODES = {"fixed": "fixed", "fit": "fitted"}


def _one_line(fit: FitResult) -> str:
    interval = f" [{fit.A_interval[0]:.3f}, {fit.A_interval[1]:.3f}]" if fit.A_interval else ""
    return f"A {fit.A:.3f}{interval}  B {fit.B:.3f}  C_mid {fit.C_mid:.4g}  ({fit.points} points)"


def _argument(
    parse: Callable[[str], N], kind: str, ok: Callable[[N], bool], rule: str
) -> Callable[[str], N]:
    """An argparse type: `text` read by `parse` (else "is not `kind`"), then held to `ok` (else
    "must be `rule`")."""

    def convert(text: str) -> N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
        return value

    return convert


_compute_value = _argument(
    float, "a number", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"
)
_positive_compute = _argument(
    float, "a number", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"
)
_pass_rate = _argument(float, "a number", lambda v: 0 < v <= 1, "a pass rate in (0, 1]")
_count = _argument(int, "an integer", lambda v: v >= 0, ">= 0")
# Checked before anything slow, such as loading a model.
_positive_count = _argument(int, "an integer", lambda v: v >= 1, ">= 1")

# Fewer bootstrap replicates give a "95 % interval" from a handful of draws, which need not even
# hold the estimate (with 1, its ends are one draw).
MIN_BOOTSTRAP = 50


def _replicates(text: str) -> int:
    """argparse type: 0 (no intervals) or at least MIN_BOOTSTRAP bootstrap replicates."""
    value = _count(text)
    if 0 < value < MIN_BOOTSTRAP:
        raise argparse.ArgumentTypeError(
            f"{value} replicates give no 95% interval worth the name: use at least "
            f"{MIN_BOOTSTRAP}, or 0 for none"
        )
    return value


# --- scalerl validate / run / trainer / generator ----------------------------------------------


def add_validate_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check a ScaleRLRun (or ScaleRLSweep) file",
        description="Exit 0 when the ScaleRLRun is valid (a ScaleRLSweep: it and every "
        "variant's run); otherwise print one line per bad field (with its path, e.g. "
        "spec.recipe.loss.type) and exit 2.",
    )
    p.add_argument("file", help="ScaleRLRun YAML")
    p.add_argument(
        "--deep",
        action="store_true",
        help="also check what the run needs on this machine, as `scalerl run` does before "
        "starting: the model folder loads, thinkEnd is one token, the data has the fields and "
        "rows, the reward resolves, the longest prompt plus the budgets fits the model",
    )
    p.set_defaults(handler=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from scalerl.spec import SWEEP_KIND, load_run, load_sweep

    try:
        kind = (yaml.safe_load(Path(args.file).read_text()) or {}).get("kind")
    except (OSError, yaml.YAMLError, AttributeError):
        kind = None  # load_run says what is wrong with the file
    if kind == SWEEP_KIND:
        sweep = load_sweep(args.file)
        runs = list(sweep.variant_runs().values())
        label = f"ScaleRLSweep {sweep.name} ({len(runs)} variants)"
    else:
        runs = [load_run(args.file)]
        label = f"ScaleRLRun {runs[0].name}"
    _check_cluster_names(runs)
    if args.deep:
        from scalerl import preflight
        from scalerl.local import resolve_paths

        for run in runs:
            preflight.check(resolve_paths(run))
    print(f"{args.file}: {label} is valid" + (" (deep check)" if args.deep else ""))
    return 0


def _check_cluster_names(runs: list[Any]) -> None:
    """A run name the operator would refuse (its children's names append to it) is refused
    here, before `kubectl apply`."""
    from scalerl.errors import SpecError
    from scalerl.operator.names import name_problems

    problems = [p for run in runs for p in name_problems(run.name, queued=bool(run.queue_name))]
    if problems:
        raise SpecError(problems)


def add_run_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a ScaleRLRun on this machine",
        description="Start one trainer and spec.generators.replicas generators as local "
        "processes; show progress; write DIR/history.jsonl, DIR/fit.json, DIR/curve.png and "
        "checkpoints. Ctrl-C stops every process; the same command again resumes.",
    )
    p.add_argument("file", help="ScaleRLRun YAML")
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scalerl.local import run_local
    from scalerl.spec import load_run

    run = load_run(args.file)
    end = run_local(run, Path(args.out) if args.out else None, display=not args.no_progress)
    if end.report is None:
        print(f"run finished; no prediction: {end.no_fit or 'no evaluations'}")
        return 0
    print(prediction_line(end.report, run.spec.compute_unit, run.spec.budget.target_pass_rate))
    return 0


def prediction_line(report: dict[str, Any], unit: str, target: float | None = None) -> str:
    """fit.json in one line: the law, where the run ends (compute in `unit`), the target pass
    rate `target` (budget.targetPassRate) and whether the run gets there, and what is known of
    the fit: its confidence, and why."""
    parts = [
        f"prediction: {_asymptote(report)}, C_mid = {report['C_mid']:.4g} {unit}, "
        f"B = {report['B']:.2f}, pass rate at budget {report['budget']:.4g} {unit}: "
        f"{report['predictedAtBudget']:.3f} {_interval(report['predictedAtBudgetInterval'])}",
        _target_words(report, unit, target),
        _confidence_words(report),
    ]
    return "".join(parts)


def _asymptote(fit: dict[str, Any]) -> str:
    """A and its interval, or `A >= x` where the points bound it only from below."""
    if fit.get("A_atLeast") is not None:
        return f"A >= {fit['A_atLeast']:.3f} (the points bound it from below only)"
    return f"A = {fit['A']:.3f} {_interval(fit.get('A_interval'))}".rstrip()


def _target_words(fit: dict[str, Any], unit: str, target: float | None) -> str:
    """Where the curve reaches the target: within the budget, beyond it, or never (A below)."""
    at = fit.get("computeToTarget")
    name = "the target" if target is None else f"target {target:g}"
    if at is None:
        return "" if target is None else f", A is below {name}"
    if at <= fit["budget"]:
        return f", {name} reached at compute {at:.4g} {unit}"
    return f", {name} lies beyond the budget (the curve reaches it at compute {at:.4g} {unit})"


def add_sweep_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="run a ScaleRLSweep's variants on this machine and rank them",
        description="Run each variant (spec.base with its patch) as `scalerl run`, at most "
        "spec.maxParallel at once; stop a variant that cannot win (spec.earlyStop: measured "
        "below the best at the same compute, its ceiling below the best one's floor); rank them "
        "the paper's way into DIR/leaderboard.json, with every curve in DIR/curves.png. Ctrl-C "
        "or SIGTERM stops every running variant (checkpoints kept) and writes the leaderboard.",
    )
    p.add_argument("file", help="ScaleRLSweep YAML")
    p.add_argument("--out", default=None, help="sweep directory (default: runs/<name>)")
    p.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run the sweep and print its leaderboard; ended by SIGTERM or Ctrl-C, the leaderboard so
    far, one line, and 128 + the signal's number (143, 130)."""
    from pathlib import Path

    from scalerl.sweep import Interrupted, run_sweep

    try:
        board = run_sweep(Path(args.file), Path(args.out) if args.out else None)
    except Interrupted as stopped:
        _print_board(stopped.board)
        print(stopped, file=sys.stderr)
        return 128 + stopped.signum
    _print_board(board)
    return 0


def _print_board(board: list[dict[str, Any]]) -> None:
    for place, row in enumerate(board, 1):
        a = "no fit" if row["A"] is None else _asymptote(row)
        why = (
            f": {row['stopReason'] or row['failure']}"
            if row["phase"] in ("Stopped", "Failed")
            else ""
        )
        evidence = f" [{row['stopEvidence']}]" if row.get("stopEvidence") else ""
        print(f"{place}. {row['name']} ({row['phase']}{evidence}{why}) {a}")


def _interval(pair: list[float] | None) -> str:
    return "" if pair is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def add_process_parsers(subparsers: Subparsers) -> None:
    """`scalerl trainer`, `scalerl generator` and `scalerl colocated`: the processes of a run
    (pods, or local runs).

    All read the environment contract of scalerl/environment.py (SCALERL_SPEC, SCALERL_RUN_DIR,
    ports, SCALERL_GENERATOR_INDEX), so they take no arguments.
    """
    for name, what in (
        ("trainer", "one trainer rank"),
        ("generator", "one vLLM generator"),
        ("colocated", "the trainer and its vLLM engine in one process (placement colocated)"),
    ):
        p = subparsers.add_parser(
            name,
            help=f"{what} of a run (reads the SCALERL_* environment)",
            description=f"Run {what}, configured by scalerl/environment.py's contract.",
        )
        p.set_defaults(handler=cmd_process, process=name)


def cmd_process(args: argparse.Namespace) -> int:
    if args.process == "trainer":
        from scalerl.trainer.main import main as process_main
    elif args.process == "colocated":
        from scalerl.colocated import main as process_main
    else:
        from scalerl.generator.main import main as process_main
    process_main()
    return 0


# --- scalerl evaluate --------------------------------------------------------------------------


def add_evaluate_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="held-out pass rate of a saved checkpoint, sampled with Hugging Face generate",
        description="Sample k completions for each held-out prompt of a run from CHECKPOINT with "
        "transformers' generate (not the run's vLLM engines), under the run's length budgets, "
        "interruption and temperature, and score them with its reward. A sample passes when "
        "its reward is > 0 and it is not truncated; the pass rate is mean@k, with the standard "
        "error of the per-prompt means.",
    )
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="an HF model folder (e.g. runs/demo/checkpoints/step-000020) or a builtin: model",
    )
    p.add_argument(
        "--spec",
        required=True,
        metavar="RUN.yaml",
        help="the ScaleRLRun whose held-out prompts, reward, budgets and temperature to use",
    )
    p.add_argument(
        "-k",
        metavar="N",
        type=_positive_count,
        default=None,
        help="samples per prompt (default: the spec's evaluation.generationsPerPrompt)",
    )
    p.add_argument(
        "--prompts",
        metavar="N",
        type=_positive_count,
        default=None,
        help="only the first N held-out prompts (default: all of data.validation.prompts)",
    )
    p.add_argument("--seed", metavar="S", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object, per-prompt records included"
    )
    p.set_defaults(handler=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from scalerl.hfeval import evaluate_checkpoint, load_spec

    run = load_spec(args.spec)
    result = evaluate_checkpoint(
        args.checkpoint, run, k=args.k, prompts=args.prompts, seed=args.seed
    )
    if args.json:
        print(json.dumps({"spec": args.spec, **result.to_dict()}))
    else:
        print(result.summary())
    return 0


# --- scalerl fit --run / scalerl operator ------------------------------------------------------


def cmd_fit_run(args: argparse.Namespace) -> int:
    """The fit Job: status.evaluations of a run -> status.prediction and its Predicted condition."""
    from scalerl.kube import Kube, KubeError
    from scalerl.operator.prediction import describe, fit_run
    from scalerl.status.kubernetes import RunStatus

    if args.file is not None or args.plot or args.predict_at or args.budget or args.target:
        raise InputError("--run takes no FILE, --plot, --predict-at, --budget or --target")
    namespace = args.namespace or _current_namespace()
    options = {"r0": args.r0, "bootstrap": args.bootstrap, "seed": args.seed}
    try:
        prediction = fit_run(
            RunStatus(Kube.connect(), namespace, args.run), args.min_compute, **options
        )
    except KubeError as err:
        raise InputError(f"ScaleRLRun {namespace}/{args.run}: {err}") from None
    if args.json:
        print(json.dumps({**prediction, "run": args.run, "namespace": namespace}))
    elif prediction:
        print(f"{namespace}/{args.run}: {describe(prediction)}")
    else:
        print(f"{namespace}/{args.run}: no fit yet (see its Predicted condition)")
    return 0


def _current_namespace() -> str:
    """The namespace kubectl would use: the pod's own, else the kubeconfig context's."""
    import os
    from pathlib import Path

    in_pod = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if in_pod.is_file():
        return in_pod.read_text().strip()
    try:
        from kubernetes import config

        _, context = config.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
        return str(context["context"].get("namespace") or "default")
    except (config.ConfigException, OSError, KeyError, TypeError):
        return "default"


def add_operator_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "operator",
        help="run the ScaleRLRun operator (kopf)",
        description="Turn ScaleRLRuns into pods, fit Jobs and status. Connects as kubectl does: "
        "in-cluster credentials in a pod, else KUBECONFIG or ~/.kube/config. Watches every "
        "namespace unless --namespace limits it.",
    )
    p.add_argument(
        "--namespace",
        metavar="NS",
        action="append",
        default=[],
        help="watch only this namespace (repeat for several)",
    )
    p.add_argument(
        "--liveness", metavar="URL", help="health endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve the runs' predictions and gang restarts on /metrics at this port",
    )
    p.add_argument("--verbose", action="store_true", help="log every handler call")
    p.set_defaults(handler=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    from scalerl.operator.main import run_operator

    return run_operator(
        args.namespace,
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        verbose=args.verbose,
    )


# --- scalerl export --------------------------------------------------------------------------


def add_export_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint's model (or LoRA adapter) as a folder to serve",
        description="Copy CHECKPOINT's model into OUT without the run's state (optimizer, "
        "scheduler, state.json). A LoRA checkpoint gives its adapter (PEFT format), or with "
        "--merge the base with the adapter merged in: a plain Hugging Face model.",
    )
    p.add_argument("checkpoint", help="a checkpoint folder, e.g. runs/x/checkpoints/step-000100")
    p.add_argument("out", help="the folder to write (new or empty)")
    p.add_argument("--merge", action="store_true", help="LoRA: merge the adapter into its base")
    p.add_argument(
        "--base",
        default=None,
        help="LoRA with --merge: the base model folder (default: the one the adapter names)",
    )
    p.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scalerl.trainer.export import export_checkpoint

    base = Path(args.base) if args.base else None
    wrote = export_checkpoint(Path(args.checkpoint), Path(args.out), merge=args.merge, base=base)
    print(f"wrote {wrote}")
    return 0


# --- scalerl track-record ------------------------------------------------------------------------


def add_track_record_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "track-record",
        help="how good finished runs' predictions were, by fraction of the run seen",
        description="Pool the track records of finished local runs (each folder's fit.json "
        "trackRecord): coverage of the 95 % intervals, median error and median width of the "
        "prediction at the budget made by 25, 50 and 75 % of each run.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run folders (runs/*)")
    p.add_argument("--plot", metavar="FILE", help="also write a PNG of it to FILE")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(handler=cmd_track_record)


def cmd_track_record(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scalerl.fit.track_report import plot, read_records, table

    records = read_records([Path(d) for d in args.dirs])
    print(json.dumps(records.to_dict(), indent=2) if args.json else table(records))
    if args.plot:
        plot(records, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


# Each entry declares one subcommand; add new commands here.
COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_run_parser,
    add_sweep_parser,
    add_validate_parser,
    add_fit_parser,
    add_compare_parser,
    add_track_record_parser,
    add_evaluate_parser,
    add_export_parser,
    add_process_parsers,
    add_operator_parser,
)


if __name__ == "__main__":
    sys.exit(main())
