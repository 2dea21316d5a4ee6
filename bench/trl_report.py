"""bench/trl_bench.py's report: the table of times to each target, each system's pass-rate
series, and TRL's time over ours."""

from __future__ import annotations

import os
import statistics

from trl_shared import Result

# --- report -----------------------------------------------------------------------------------

LEGEND = """\
start     pass rate at step 0 (the base model; the same for every system: same evaluator, seed).
final     pass rate at the last evaluation.
+g s      training clock until the start + g was reached (the first evaluation at or above it
          whose next evaluation is at or above it too): TRL from on_train_begin (after imports,
          model load, trainer set-up), ours from the end of the step-0 evaluation (after vLLM
          start-up); evaluations (and our checkpoints) excluded for all three.
s/step    training wall seconds per optimizer step (evaluations and start-up excluded).
tok/s     model tokens sampled for training (tool and environment tokens not counted) per
          second of training clock, until the evaluation that reached the last target.
wall s    from spawning the process until the evaluation that reached the last target:
          start-up (imports, model loads, ours: vLLM engines) and every evaluation included.
cpu s     CPU seconds (user + system) of the whole process tree until that evaluation.
steps     optimizer steps at the evaluation that reached the last target (or the last one).
load      1-minute load average while the system ran, mean/max ({cores} cores)."""


def tokens_per_s(result: Result) -> float | None:
    """Model tokens sampled for training per second of training clock, until the evaluation
    that reached the last target (or the last one)."""
    at = result.hit or (result.evals[-1] if result.evals else {})
    tokens, seconds = at.get("model_tokens"), at.get("train_s")
    return tokens / seconds if tokens is not None and seconds else None


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(rounds: list[list[Result]], gains: list[float], k: int) -> None:
    to = "".join(f"{'+' + format(g, 'g') + ' s':>8}" for g in gains)
    header = (
        f"{'#':>2} {'system':<24}{'start':>7}{'final':>7}{'steps':>6}{'s/step':>8}{'tok/s':>7}{to}"
        f"{'wall s':>8}{'cpu s':>8}{'load':>10}"
    )
    print(
        f"\nTime to +{', +'.join(format(g, 'g') for g in gains)} held-out pass rate over the "
        "start, reached and confirmed by the next evaluation"
    )
    print(header)
    print("-" * len(header))
    for number, results in enumerate(rounds, start=1):
        for r in results:
            hit = r.hit or {}
            load = f"{r.load['mean']:.1f}/{r.load['max']:.1f}" if r.load else "-"
            times = "".join(f"{_fmt((r.first(g) or {}).get('train_s')):>8}" for g in gains)
            print(
                f"{number:>2} {r.system:<24}{_fmt(r.start, '.3f'):>7}{_fmt(r.final, '.3f'):>7}"
                f"{r.steps:>6}{_fmt(r.extra.get('seconds_per_step'), '.3f'):>8}"
                f"{_fmt(tokens_per_s(r), '.0f'):>7}{times}"
                f"{_fmt(hit.get('since_spawn_s')):>8}{_fmt(hit.get('cpu_s'), '.0f'):>8}{load:>10}"
            )
            if r.note:
                print(f"   {r.system}: {r.note}")
    print(LEGEND.format(cores=os.cpu_count()))
    series(rounds, k)
    ratios(rounds, gains)


def series(rounds: list[list[Result]], k: int, width: int = 12) -> None:
    """Each system's evaluator and pass-rate series (ours: the engine's beside it)."""
    print(
        f"\nPass-rate series: mean@{k} ± standard error of scalerl.hfeval (HF generate), the "
        "same prompts and seed (spec.seed + 1000 + step) for every system"
    )
    for number, results in enumerate(rounds, start=1):
        for r in results:
            if not r.evals:
                continue
            prompts = r.evals[0]["samples"] // k
            print(f"{number:>2} {r.system}: {r.evaluator}; {prompts} held-out prompts")
            for at in range(0, len(r.evals), width):
                chunk = r.evals[at : at + width]
                print("     step   " + "".join(f"{e['step']:>7}" for e in chunk))
                print("     HF     " + "".join(f"{e['pass_rate']:>7.3f}" for e in chunk))
                print("      ±     " + "".join(f"{e['stderr']:>7.3f}" for e in chunk))
                if "engine_pass_rate" in chunk[0]:
                    print("     engine " + "".join(f"{e['engine_pass_rate']:>7.3f}" for e in chunk))
            gaps = [
                abs(e["engine_pass_rate"] - e["pass_rate"])
                / max(1e-9, (e["engine_stderr"] ** 2 + e["stderr"] ** 2) ** 0.5)
                for e in r.evals
                if "engine_pass_rate" in e
            ]
            if gaps:
                print(
                    f"     engine (vLLM, history.jsonl) vs HF: largest gap {max(gaps):.1f} "
                    f"standard errors; {sum(g > 3 for g in gaps)} of {len(gaps)} beyond 3"
                    f"; the engine reached the last target at step "
                    f"{r.extra.get('engine_reached_at')}"
                )
            if r.extra.get("steps_without_checkpoint"):
                print(f"     no checkpoint at steps {r.extra['steps_without_checkpoint']}")


def ratios(rounds: list[list[Result]], gains: list[float]) -> None:
    """TRL's time over ours, per target and clock: > 1 means we got there first."""
    print(
        "\nRatio TRL / ours (> 1: ours is faster; the goal is >= 1 for colocated, on the way to 2):"
    )
    for placement in ("colocated", "disaggregated"):
        pairs = [
            (trl, ours)
            for results in rounds
            for trl in results
            if trl.system.startswith("TRL")
            for ours in results
            if ours.system == f"scalerl {placement}"
        ]
        if not pairs:
            continue
        measures = [(f"+{g:g}, training clocks", g, "train_s") for g in gains]
        measures.append((f"+{gains[-1]:g}, wall clocks", gains[-1], "since_spawn_s"))
        measures.append((f"+{gains[-1]:g}, CPU seconds", gains[-1], "cpu_s"))
        measures.append(("seconds per step", None, "seconds_per_step"))
        print(f"  {placement}:")
        for label, gain, key in measures:
            values: list[str] = []
            numbers: list[float] = []
            for trl, ours in pairs:
                if gain is None:
                    a, b = trl.extra.get(key), ours.extra.get(key)
                else:
                    a = (trl.first(gain) or {}).get(key)
                    b = (ours.first(gain) or {}).get(key)
                if a is None or b is None or b <= 0:
                    values.append("ours not reached" if b is None else "TRL not reached")
                    continue
                numbers.append(a / b)
                values.append(f"{a / b:.2f}x")
            median = f"   median {statistics.median(numbers):.2f}x" if len(numbers) > 1 else ""
            print(f"    {label:<28} {'  '.join(values)}{median}")
