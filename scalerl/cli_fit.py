"""The `scalerl` commands that fit and read scaling curves: `fit` (a file, or a run's
status.evaluations with --run), `compare`, `track-record`, and the one-line readings of a fit
that `scalerl run` and `scalerl sweep` print (`prediction_line`, `asymptote_text`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from scalerl.cli_args import compute_value, count, pass_rate, positive_compute
from scalerl.errors import FitError, InputError

if TYPE_CHECKING:
    from scalerl.cli_args import Subparsers
    from scalerl.fit import Curve, FitResult
    from scalerl.fit.outlook import FitReport
    from scalerl.status.kubernetes import RunStatus


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
        type=compute_value,
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
        type=compute_value,
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
        type=positive_compute,
        default=None,
        help="the compute the run will end at, for predictedAtBudget and its interval "
        "(default: the last point's)",
    )
    p.add_argument(
        "--target",
        metavar="R",
        type=pass_rate,
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
    """The law and the forecast at `compute` (audit F5: they differ beyond the data and were
    shown under one name), the forecast's band, what an evaluation there would read, and the
    forecast's notes there (`scalerl.fit.decision.forecast_notes`)."""
    from scalerl.fit.decision import forecast_notes

    forecast = float(result.forecast(compute))
    band, reads = result.predict_interval(compute), result.predictive_interval(compute)
    out: dict[str, Any] = {
        "compute": compute,
        "law": float(result.predict(compute)),
        "forecast": forecast,
        "model": result.forecast_model()["model"],
        "forecastInterval": None if band is None else list(band),
        "evaluationInterval": None if reads is None else list(reads),
        "reach": result.reach(compute),
    }
    interval = None if reads is None else (float(reads[0]), float(reads[1]))
    out["forecastNotes"] = forecast_notes(result, compute, forecast, interval)
    return out


FILE_UNIT = "in the file's units"  # a curve file's compute has no unit we know


def target_words(fit: dict[str, Any], unit: str, target: float | None) -> str:
    """The target line (`scalerl.fit.decision.target_words`)."""
    from scalerl.fit.decision import target_words as words

    return words(fit, unit, target)


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
    # Evaluations the file marks fit_excluded (too many unscored samples): not fitted, said why.
    lines[1:1] = [
        f"  left out: step {e['step']} at compute {e['compute']:.4g}: {e['reason']}"
        for e in fitted.left_out
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
    lines.append(_forecast_line(fitted.outlook))
    if target is not None:
        lines.append(f"  {target_words(fitted.outlook, FILE_UNIT, target)[2:]}")
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
    """The forecast at a compute (its model named) with its band, the wider interval an
    evaluation would read, the law there where the forecast is not the law, and the notes."""
    from scalerl.fit.decision import notes_words

    band_of, reads = p["forecastInterval"], p["evaluationInterval"]
    band = f" [{band_of[0]:.4f}, {band_of[1]:.4f}]" if band_of else ""
    evaluation = (
        f"; an evaluation there would read [{reads[0]:.4f}, {reads[1]:.4f}]" if reads else ""
    )
    law = "" if p["model"] == "law" else f"; the law alone {p['law']:.4f}"
    return (
        f"  at compute {p['compute']:.6g}: forecast ({p['model']}) {p['forecast']:.4f}{band}"
        f"{evaluation}{law}{notes_words(p)}"
    )


def _forecast_line(outlook: dict[str, Any]) -> str:
    """Which model the forecast is, and the evidence it was chosen by."""
    chosen = outlook.get("forecast") or {}
    evidence = chosen.get("evidence")
    if not evidence:
        why = "fewer than two earlier fits to judge the law by"
    else:
        why = (
            f"of {evidence['compared']} later evaluations its {evidence['origins']} earlier fits "
            f"were judged at, {evidence['above']} read above and {evidence['below']} below "
            "their own intervals"
        )
    return f"  forecast {chosen.get('model')} (drift weight {chosen.get('weight', 0.0):.2f}): {why}"


def _confidence_line(outlook: dict[str, Any]) -> str:
    """What is known of the fit, in fit.json's words."""
    from scalerl.fit.decision import confidence_words

    return f"  confidence{confidence_words(outlook)[1:]}"


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


# Fewer bootstrap replicates give a "95 % interval" from a handful of draws, which need not even
# hold the estimate (with 1, its ends are one draw).
MIN_BOOTSTRAP = 50


def _replicates(text: str) -> int:
    """argparse type: 0 (no intervals) or at least MIN_BOOTSTRAP bootstrap replicates."""
    value = count(text)
    if 0 < value < MIN_BOOTSTRAP:
        raise argparse.ArgumentTypeError(
            f"{value} replicates give no 95% interval worth the name: use at least "
            f"{MIN_BOOTSTRAP}, or 0 for none"
        )
    return value


# --- a fit in one line (scalerl run, scalerl sweep) ----------------------------------------------


def prediction_line(report: dict[str, Any], unit: str, target: float | None = None) -> str:
    """fit.json in one line: the law, where the run ends (compute in `unit`), the target pass
    rate `target` (budget.targetPassRate) and whether the run gets there, and what is known of
    the fit: its confidence, and why."""
    from scalerl.fit.decision import confidence_words, notes_words

    model = (report.get("forecast") or {}).get("model", "law")
    parts = [
        f"prediction: {asymptote_text(report)}, C_mid = {report['C_mid']:.4g} {unit}, "
        f"B = {report['B']:.2f}, forecast ({model}) at budget {report['budget']:.4g} {unit}: "
        f"{report['predictedAtBudget']:.3f} {_interval(report['predictedAtBudgetInterval'])}",
        notes_words(report),
        target_words(report, unit, target),
        confidence_words(report),
    ]
    return "".join(parts)


def asymptote_text(fit: dict[str, Any]) -> str:
    """A and its interval, or `A >= x` where the points bound it only from below."""
    if fit.get("A_atLeast") is not None:
        return f"A >= {fit['A_atLeast']:.3f} (the points bound it from below only)"
    return f"A = {fit['A']:.3f} {_interval(fit.get('A_interval'))}".rstrip()


def _interval(pair: list[float] | None) -> str:
    return "" if pair is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


# --- scalerl fit --run ----------------------------------------------------------------------------


def cmd_fit_run(args: argparse.Namespace) -> int:
    """The fit Job: status.evaluations of a run -> status.prediction and its Predicted condition."""
    from scalerl.kube import Kube, KubeError
    from scalerl.operator.prediction import describe, fit_run  # the operator's own fit Job
    from scalerl.status.kubernetes import RunStatus

    if args.file is not None or args.plot or args.predict_at or args.budget or args.target:
        raise InputError("--run takes no FILE, --plot, --predict-at, --budget or --target")
    namespace = args.namespace or _current_namespace()
    reports: list[dict[str, Any]] = []  # the fit as fit.json has it, for the trackers
    options = {"r0": args.r0, "bootstrap": args.bootstrap, "seed": args.seed}
    try:
        status = RunStatus(Kube.connect(), namespace, args.run)
        prediction = fit_run(status, args.min_compute, on_report=reports.append, **options)
        if prediction and reports:
            _track_fit(status, reports[-1])
    except KubeError as err:
        raise InputError(f"ScaleRLRun {namespace}/{args.run}: {err}") from None
    if args.json:
        print(json.dumps({**prediction, "run": args.run, "namespace": namespace}))
    elif prediction:
        print(f"{namespace}/{args.run}: {describe(prediction)}")
    else:
        print(f"{namespace}/{args.run}: no fit yet (see its Predicted condition)")
    return 0


def _track_fit(status: RunStatus, report: dict[str, Any]) -> None:
    """The fit to spec.tracking's trackers, after status.prediction is written: a tracker's
    failure (or the run's, read again for its spec and uid) is a warning, never the fit Job's."""
    from scalerl.spec import parse_run
    from scalerl.tracking.fit_job import log_fit

    try:
        run_obj = status.read()
        logged = log_fit(parse_run(run_obj), run_obj["metadata"]["uid"], report)
    except Exception as err:  # noqa: BLE001 — the prediction is written; trackers are extra
        message = f"the fit was not logged to the trackers: {type(err).__name__}: {err}"
        print(message[:400], file=sys.stderr)
        return
    step = report.get("lastStep")  # stderr: stdout is the prediction (--json)
    for tracker, has in logged.items():
        line = f"fit of step {step} logged to {tracker}"
        if not has:
            line = f"fit of step {step} not logged to {tracker} (see the warnings above)"
        print(line, file=sys.stderr)


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
