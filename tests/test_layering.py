"""Layering: light modules stay light, so the CLI, `validate` and the fitter start fast and the
future operator image needs no torch or vLLM."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest


def imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("scalerl.spec", {"torch", "vllm", "transformers", "scipy", "huggingface_hub"}),
        (
            "scalerl.cli",
            {"torch", "vllm", "transformers", "scipy", "matplotlib", "huggingface_hub"},
        ),
        ("scalerl.fit", {"torch", "vllm", "transformers", "matplotlib"}),
        ("scalerl.metrics", {"torch", "vllm"}),
        ("scalerl.recipe", {"vllm", "transformers", "scipy"}),
        ("scalerl.trainer.main", {"vllm", "kopf"}),
        # The operator image needs neither torch nor vLLM, and never calls the Hub; the fit Job
        # imports scipy late.
        (
            "scalerl.operator",
            {"torch", "vllm", "transformers", "scipy", "matplotlib", "huggingface_hub"},
        ),
        ("scalerl.status", {"torch", "vllm", "transformers", "kopf"}),
        ("scalerl.status.kubernetes", {"torch", "vllm", "transformers", "kopf", "scipy"}),
    ],
)
def test_module_does_not_pull_in_heavy_dependencies(module: str, forbidden: set[str]) -> None:
    assert imported_after(module) & forbidden == set()


def sibling_imports(folder: Path) -> dict[str, set[str]]:
    """Each script of `folder` and the scripts beside it that it imports (at any depth: a
    function's own import counts too, since it runs when the function does)."""
    scripts = {p.stem: p for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in scripts.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
        graph[name] = {other for other in found & scripts.keys() if other != name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as the path that closes it, or [] when there is none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        for other in sorted(graph[node]):
            found = visit(other, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return []


def test_cycle_in_finds_a_cycle_and_only_one() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_bench_scripts_import_each_other_without_a_cycle() -> None:
    # bench/ is scripts, not a package, so lint-imports cannot see it: what two scripts share
    # lives in a third that imports neither (trl_bench.py and trl_env_bench.py: trl_worker.py).
    bench = Path(__file__).resolve().parent.parent / "bench"
    assert cycle_in(sibling_imports(bench)) == []
