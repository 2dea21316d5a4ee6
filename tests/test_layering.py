"""Layering: light modules stay light, so the CLI, `validate` and the fitter start fast and the
future operator image needs no torch or vLLM."""

from __future__ import annotations

import subprocess
import sys

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
