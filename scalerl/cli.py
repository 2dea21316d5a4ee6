"""The `scalerl` command line.

Each command is a pair: `add_<name>_parser(subparsers)` declares its arguments and points
`handler` at `cmd_<name>(args) -> int`. Handlers import what they need when they run, so
`scalerl --help` and unrelated commands stay fast. `main` is the one top-level error handler: a
ScaleRLError becomes `error: <message>` on stderr and its exit code; anything else is a bug and
keeps its traceback. The commands that fit and read scaling curves live in `scalerl.cli_fit`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from scalerl.cli_args import positive_count
from scalerl.cli_fit import (
    add_compare_parser,
    add_fit_parser,
    add_track_record_parser,
    asymptote_text,
    prediction_line,
)
from scalerl.cli_score import add_score_parser
from scalerl.errors import SandboxUnavailable, ScaleRLError, report

if TYPE_CHECKING:
    from scalerl.cli_args import Subparsers


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (0 ok, 2 bad input, 1 other failures)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse reports usage errors (2) and --help (0) by exiting
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 2
    if os.getpid() == 1 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # A container's first process: the kernel ignores a signal it has no handler for, so a
        # pod's deletion would wait out its whole grace period (a fit Job's `scalerl fit`).
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(args.handler(args))
    except ScaleRLError as err:
        return report(err)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: one line, no traceback
        print(str(stop) or "interrupted", file=sys.stderr)
        return 128 + int(getattr(stop, "signum", 2))  # as a shell reports it: 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, for a command that has no handler of its own."""

    signum = signal.SIGTERM


def _terminated(signum: int, frame: object) -> None:
    raise Terminated("terminated")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalerl",
        description="ScaleRL post-training runs and their scaling-curve predictions.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in COMMANDS:
        add_parser(subparsers)
    return parser


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
    _check_hub_ids(runs)
    if args.deep:
        from scalerl import preflight
        from scalerl.runpaths import resolve_paths

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


def _check_hub_ids(runs: list[Any]) -> None:
    """A malformed hf:// id is refused here; --deep also resolves and downloads each."""
    from scalerl.errors import SpecError
    from scalerl.hub import id_problems

    problems = [p for run in runs for p in id_problems(run.spec)]
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
    for domain, fit in (end.report.get("domains") or {}).items():  # one curve per domain
        law = fit.get("error") or (
            f"{asymptote_text(fit)}, C_mid = {fit['C_mid']:.4g} {run.spec.compute_unit}, "
            f"B = {fit['B']:.2f} ({fit['confidence']})"
        )
        print(f"  {domain}: {law}")
    return 0


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
        a = "no fit" if row["A"] is None else asymptote_text(row)
        why = (
            f": {row['stopReason'] or row['failure']}"
            if row["phase"] in ("Stopped", "Failed")
            else ""
        )
        evidence = f" [{row['stopEvidence']}]" if row.get("stopEvidence") else ""
        tied = row.get("tiedWith") or []
        tie = f", tied with {', '.join(tied)} at equal compute" if tied else ""
        print(f"{place}. {row['name']} ({row['phase']}{evidence}{why}) {a}{tie}")


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
        "interruption and sampling settings (temperature, top-p, top-k, min-p), and score them "
        "with its reward. A sample passes when its reward is > 0 and it is not truncated; the "
        "pass rate is mean@k, passes / (prompts x k), with the standard error of the "
        "per-prompt means. A sample that could not be "
        "scored (the code sandbox failed, the reward function raised) counts as not passed and "
        "is reported as unscored. A run with spec.environment plays each held-out prompt "
        "through its environment (turns, tools, rubric); a rollout passes at a reward of at "
        "least environment.passThreshold, not truncated; one the environment failed, or whose "
        "rubric raised, is unscored.",
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
        help="the ScaleRLRun whose held-out prompts, reward, budgets and sampling to use",
    )
    p.add_argument(
        "-k",
        metavar="N",
        type=positive_count,
        default=None,
        help="samples per prompt (default: the spec's evaluation.generationsPerPrompt)",
    )
    p.add_argument(
        "--prompts",
        metavar="N",
        type=positive_count,
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


# --- scalerl operator ----------------------------------------------------------------------------


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


# --- scalerl fetch-sources -----------------------------------------------------------------------


def add_fetch_sources_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "fetch-sources",
        help="resolve and download a run's hf:// model and data (a cluster's initializer Job)",
        description="Resolve each hf:// id of the run to a commit and download that commit into "
        "the Hugging Face cache (HF_HUB_CACHE; resumable, skipped when the commit is there), as "
        "`scalerl run` does before it starts; write the records to OUT/sources.json (a commit "
        "recorded there is loaded again) and, with --run, to the ScaleRLRun's status.sources "
        "with its SourcesReady condition. Exit 2 with one line when a source cannot be read.",
    )
    p.add_argument("--spec", required=True, help="ScaleRLRun YAML")
    p.add_argument("--out", required=True, help="the run directory (sources.json)")
    p.add_argument("--run", metavar="NAME", help="write the outcome to this ScaleRLRun's status")
    p.add_argument("--namespace", metavar="NS", help="namespace of --run")
    p.set_defaults(handler=cmd_fetch_sources)


def cmd_fetch_sources(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scalerl.errors import InputError
    from scalerl.fetch import fetch_into_status
    from scalerl.spec import load_run

    if bool(args.run) != bool(args.namespace):
        raise InputError("--run and --namespace go together (the run whose status to write)")
    run = load_run(args.spec)
    status = None
    if args.run:
        from scalerl.kube import Kube
        from scalerl.status.kubernetes import RunStatus

        kube = Kube.connect(agent="scalerl-initializer")
        status = RunStatus(kube, args.namespace, args.run)
    return fetch_into_status(run, Path(args.out), status)


# --- scalerl sandbox-check ----------------------------------------------------------------------


def add_sandbox_check_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "sandbox-check",
        help="make one sandbox for model-written code here and say how isolated it is (a "
        "cluster's sandbox check Job)",
        description="Make one sandbox (scalerl.sandbox) as `reward: code` would in this "
        "process's place, print its mode and any guarantee it lacks, and run a program in it "
        "that looks for this process's secrets, a file of its user and the network "
        "(scalerl.sandbox.selftest), then score a right and a wrong program in each test shape "
        "there with the generators' code reward. Exit 3 with the reason (SandboxUnavailable) "
        "where no sandbox can be made (unless --allow-plain, the spec's "
        "data.code.unsafeAllowPlain, accepts plain processes), where one let the program reach "
        "anything, or where it scored a known program wrongly.",
    )
    p.add_argument(
        "--allow-plain", action="store_true", help="accept plain, unsandboxed processes (UNSAFE)"
    )
    p.set_defaults(handler=cmd_sandbox_check)


TERMINATION_LOG = "/dev/termination-log"  # a container's default terminationMessagePath


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from scalerl.generator.code_reward import Unscored, known_scores
    from scalerl.sandbox import Sandbox
    from scalerl.sandbox.selftest import check

    mode, reached = check(args.allow_plain)
    try:  # the generators' harness, run where they will run it
        with Sandbox(mode) as sandbox:
            scores = known_scores(sandbox)
    except Unscored as err:
        why = f"the sandbox ({mode.mode}) could not score a program: {err.reason}"
        raise SandboxUnavailable(why) from err
    if wrong := {shape: s for shape, s in scores.items() if s != (1.0, -1.0)}:
        raise SandboxUnavailable(
            f"the sandbox ({mode.mode}) scored known programs wrongly (right, wrong): {wrong}"
        )
    said = f"sandbox: {mode.describe()}\n" + (
        f"a program in it reached: {', '.join(reached)}"
        if reached
        else "a program in it reached nothing: not this process's environment nor any under "
        "/proc, not a file of this user, not 127.0.0.1"
    )
    said += f"\nit scored a right program +1 and a wrong one -1 in {', '.join(scores)} tests"
    print(said)
    # In a pod, its termination message: the operator quotes it in the run's status.
    if os.access(TERMINATION_LOG, os.W_OK):
        with open(TERMINATION_LOG, "w") as message:
            message.write(said)
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
    add_score_parser,
    add_fetch_sources_parser,
    add_sandbox_check_parser,
    add_process_parsers,
    add_operator_parser,
)


if __name__ == "__main__":
    sys.exit(main())
