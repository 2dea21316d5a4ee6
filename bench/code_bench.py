"""Benchmark: code-reward tests executed per second per core, sandboxed (scalerl.sandbox: the
isolation this machine gives, bubblewrap where it can) against a plain subprocess running the
same program (no isolation, no limits), measured in the same run on the same tests.

    .venv/bin/python bench/code_bench.py [--tests N] [--workers W]

A test is one stdin/stdout case of a small program (read two numbers, print their sum), the
shape competitive-programming data has; the program's own work is negligible, so the figure is
the cost of starting, isolating, feeding and reaping one execution. `--workers` (default: one per
CPU this process may use) tests run at once, as the generator's pool runs them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from scalerl.sandbox import Limits, execute, isolation, probe

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
LIMITS = Limits(wall_seconds=10.0, cpu_seconds=10)


def sandboxed(n: int) -> bool:
    done = execute(PROGRAM, f"{n} {n + 1}\n".encode(), LIMITS)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    mode = probe()
    cores = len(os.sched_getaffinity(0))
    print(
        f"isolation: {mode.mode}"
        + (f" (without {', '.join(mode.missing)})" if mode.missing else "")
    )
    print(f"{args.tests} tests, {args.workers} at once, {cores} cores")
    rate(plain, min(args.tests, 10), args.workers)  # warm the page cache and the interpreter
    results = {"sandboxed": rate(sandboxed, args.tests, args.workers)}
    results["plain subprocess"] = rate(plain, args.tests, args.workers)
    for name, per_second in results.items():
        print(f"{name:>17}: {per_second:7.1f} tests/s, {per_second / cores:6.1f} tests/s/core")
    ratio = results["sandboxed"] / results["plain subprocess"]
    print(f"sandboxed / plain: {ratio:.2f}")


if __name__ == "__main__":
    main()
