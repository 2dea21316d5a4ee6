"""Benchmark: code-reward tests executed per second per core, sandboxed (scalerl.sandbox: the
isolation this machine gives, bubblewrap where it can) against a plain subprocess running the
same program (no isolation, no limits), measured in the same run on the same tests. Sandboxed
twice: in a sandbox kept by each worker (how a run scores: one start per worker, then a forked
child per program) and in a sandbox of its own per test (`scalerl score`'s one-off).

    .venv/bin/python bench/code_bench.py [--tests N] [--workers W] [--run [--steps S]]

A test is one stdin/stdout case of a small program (read two numbers, print their sum), the
shape competitive-programming data has; the program's own work is negligible, so the figure is
the cost of starting, isolating, feeding and reaping one execution. `--workers` (default: one per
CPU this process may use) tests run at once, as the generator's pool runs them.

`--run` also measures the generator's tokens/s on the same run (examples/code.yaml cut to
`--steps` steps) twice: with `reward: code`, and with a reward that costs nothing (+-1 by a hash of
the answer, the same variance of signal). It prints how long the engine waited with every group in
flight waiting for its tests (the generators' `reward_wait` seconds): the time the sandboxes cost
the engine by making it wait, as against sharing the machine's cores with it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scalerl.runfile import run_command, write_variant
from scalerl.sandbox import Execution, Limits, Sandbox, execute, isolation, probe
from scalerl.status.history import read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "code.yaml"
FREE_REWARD = """import hashlib


def score(answer: str, reference: str) -> float:
    return 1.0 if hashlib.sha1(answer.encode()).digest()[0] % 2 else -1.0
"""

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
LIMITS = Limits(wall_seconds=10.0, cpu_seconds=10)


_KEPT = threading.local()
_ALL_KEPT: list[Sandbox] = []


def kept_sandbox(n: int) -> bool:
    box = getattr(_KEPT, "box", None)
    if box is None:
        box = _KEPT.box = Sandbox()
        _ALL_KEPT.append(box)
    return _right(box.run(PROGRAM, f"{n} {n + 1}\n".encode(), LIMITS), n)


def own_sandbox(n: int) -> bool:
    return _right(execute(PROGRAM, f"{n} {n + 1}\n".encode(), LIMITS), n)


def _right(done: Execution, n: int) -> bool:
    return done.returncode == 0 and done.stdout == f"{2 * n + 1}\n".encode()


def plain(n: int) -> bool:
    done = subprocess.run(
        [isolation.interpreter(), "-I", "-c", PROGRAM],
        input=f"{n} {n + 1}\n".encode(),
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.returncode == 0 and done.stdout == f"{2 * n + 1}\n".encode()


def rate(run: Callable[[int], bool], tests: int, workers: int) -> float:
    """Tests per second with `workers` running at once; every test must pass."""
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        passed = sum(pool.map(run, range(tests)))
    elapsed = time.perf_counter() - started
    if passed != tests:
        raise SystemExit(f"{run.__name__}: only {passed} of {tests} tests passed")
    return tests / elapsed


def generation(work: Path, reward: str, steps: int) -> dict[str, Any]:
    """The generators' totals at the end of `steps` steps of examples/code.yaml with `reward`."""
    name = reward.replace(":", "-")
    changes = {
        "budget": {"maxSteps": steps},
        "data": {"reward": reward},
        "evaluation": {"everySteps": 2},
        "fit": {"everyEvaluations": 100},
    }
    spec = write_variant(EXAMPLE, work / f"{name}.yaml", changes)
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = work / name
    done = subprocess.run(
        run_command(spec, out), capture_output=True, text=True, env=env, timeout=3600
    )
    if done.returncode != 0:
        raise SystemExit(f"{reward} run failed:\n{done.stdout}{done.stderr}")
    return dict(read_history(out / "history.jsonl")[-1]["generation"])


def tokens_per_second(steps: int) -> None:
    print(f"generator tokens/s, examples/code.yaml cut to {steps} steps")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "free_reward.py").write_text(FREE_REWARD)
        runs = {"reward: code": "code", "free reward": "free_reward:score"}
        rates = {}
        for label, reward in runs.items():
            g = generation(work, reward, steps)
            seconds = g["generation_seconds"]
            rates[label] = g["generated_tokens"] / seconds
            print(
                f"{label:>13}: {g['generated_tokens']:6.0f} tokens in {seconds:5.0f} s of "
                f"generation, {rates[label]:6.1f} tokens/s; per generator: groups scoring "
                f"{g['generator_score_seconds']:6.1f} s (summed: they overlap), engine waiting "
                f"on rewards {g['generator_reward_wait_seconds']:5.1f} s, idle "
                f"{g['generator_idle_seconds']:5.1f} s"
            )
    print(f"code / free: {rates['reward: code'] / rates['free reward']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--run", action="store_true", help="also the tokens/s of a run")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    mode = probe()
    cores = len(os.sched_getaffinity(0))
    print(
        f"isolation: {mode.mode}"
        + (f" (without {', '.join(mode.missing)})" if mode.missing else "")
    )
    print(f"{args.tests} tests, {args.workers} at once, {cores} cores")
    rate(plain, min(args.tests, 10), args.workers)  # warm the page cache and the interpreter
    results = {"kept sandbox": rate(kept_sandbox, args.tests, args.workers)}
    for box in _ALL_KEPT:
        box.close()
    results["sandbox per test"] = rate(own_sandbox, args.tests, args.workers)
    results["plain subprocess"] = rate(plain, args.tests, args.workers)
    for name, per_second in results.items():
        print(f"{name:>17}: {per_second:7.1f} tests/s, {per_second / cores:6.1f} tests/s/core")
    plain_rate = results["plain subprocess"]
    print(
        f"kept sandbox / plain: {results['kept sandbox'] / plain_rate:.2f}; "
        f"sandbox per test / plain: {results['sandbox per test'] / plain_rate:.2f}"
    )
    if args.run:
        tokens_per_second(args.steps)


if __name__ == "__main__":
    main()
