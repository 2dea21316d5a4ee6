"""Resolving a cached `builtin:` name stays light: it imports neither torch, transformers nor
tokenizers (~10 s of `validate --deep` and of every `scalerl run`'s preflight before), and finds
the cache entry that every earlier build wrote (the built-ins' cache keys are unchanged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scalerl.demo.assets import (
    CHAT_ARITH_25M,
    MANIFEST,
    ChatArithParams,
    DemoParams,
    default_cache_dir,
    prepare_chat_arith,
    prepare_demo,
)
from scalerl.demo.builtins import BUILDERS, known_names
from scalerl.demo.code_assets import CodeParams
from scalerl.demo.math_code import MathCodeParams
from scalerl.demo.tool_arith import ToolArithParams, prepare_tool_arith

HEAVY = {"torch", "transformers", "tokenizers"}

# Each built-in's cache entry: `<name>-<key>` (scalerl.demo.assets._cached).
ENTRIES: dict[str, tuple[str, Any]] = {
    "demo": ("demo", DemoParams()),
    "chat-arith": ("chat-arith", ChatArithParams()),
    "chat-arith-25m": ("chat-arith", CHAT_ARITH_25M),
    "code": ("code", CodeParams()),
    "math-code": ("math-code", MathCodeParams()),
    "tool-arith": ("tool-arith", ToolArithParams()),
}

# The keys the entries in users' caches were built under. A key that changes makes every user
# rebuild (minutes each); change one here only with the build itself (its VERSION bumped).
KEYS = {
    "demo": "84942715ef997483",
    "chat-arith": "224cc8a4dc472b70",
    "chat-arith-25m": "3ba49f60d12e82e4",
    "code": "4cabcb6fb5adc217",
    "math-code": "8d8dd8609bb2861f",
    "tool-arith": "d486c7228b9d3053",
}


def resolve_in_fresh_interpreter(
    names: list[str], env: dict[str, str]
) -> tuple[dict[str, Path], set[str]]:
    """Each name's path as a fresh interpreter resolves it, and the top-level modules it had
    imported by then."""
    code = (
        "import json, sys\n"
        "from scalerl.demo.builtins import resolve_builtin\n"
        f"paths = {{n: str(resolve_builtin(n)) for n in {names!r}}}\n"
        "print(json.dumps({'paths': paths, 'modules': sorted(sys.modules)}))\n"
    )
    # A build (what this test must not see) would take minutes: the timeout ends it.
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    )
    found = json.loads(out.stdout.splitlines()[-1])
    modules = {name.split(".")[0] for name in found["modules"]}
    return {n: Path(p) for n, p in found["paths"].items()}, modules


def test_every_builtin_is_listed_here() -> None:
    assert set(ENTRIES) == set(BUILDERS)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_builtin_cache_keys_are_unchanged(name: str) -> None:
    assert ENTRIES[name][1].key() == KEYS[name]


def test_every_cached_builtin_resolves_without_torch(tmp_path: Path) -> None:
    """Every built-in, its entry present (a manifest is what marks an entry complete): found
    where its key says, with no heavy import. No model is built: code and math-code take
    minutes."""
    for cache_name, params in ENTRIES.values():
        entry = tmp_path / f"{cache_name}-{params.key()}"
        entry.mkdir(exist_ok=True)
        (entry / MANIFEST).write_text("{}\n")
    before = set(tmp_path.iterdir())
    env = {**os.environ, "SCALERL_CACHE": str(tmp_path)}
    paths, modules = resolve_in_fresh_interpreter(known_names(), env)
    assert modules & HEAVY == set()
    for name, path in paths.items():
        cache_name, params = ENTRIES[name.removeprefix("builtin:").partition("/")[0]]
        assert path.parent == tmp_path / f"{cache_name}-{params.key()}"
    assert set(tmp_path.iterdir()) == before  # nothing built beside them


def test_real_cached_builtins_resolve_without_torch() -> None:
    """The real entries of the default cache (built here on first use, as the other tests of
    these built-ins do): resolved to the same paths as their builders give, no heavy import."""
    cache = default_cache_dir()
    expected = {
        "builtin:demo": prepare_demo(cache).model_path,
        "builtin:chat-arith/train": prepare_chat_arith(cache).train_path,
        "builtin:tool-arith": prepare_tool_arith(cache),
    }
    paths, modules = resolve_in_fresh_interpreter(list(expected), dict(os.environ))
    assert modules & HEAVY == set()
    assert paths == expected


def test_make_test_builds_each_builtin_once_before_the_tests(tmp_path: Path) -> None:
    """`python -m scalerl.demo.builtins` (make test-builtins): cached entries are found, not
    built again, and each is named with its model folder; an unknown name is refused."""
    for cache_name, params in ENTRIES.values():
        entry = tmp_path / f"{cache_name}-{params.key()}"
        entry.mkdir()
        (entry / MANIFEST).write_text("{}\n")
    env = {**os.environ, "SCALERL_CACHE": str(tmp_path)}
    command = [sys.executable, "-m", "scalerl.demo.builtins"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = {line.split()[0]: Path(line.split()[1]) for line in done.stdout.splitlines()}
    assert set(built) == {f"builtin:{n}" for n in BUILDERS if n != "chat-arith-25m"}
    for name, path in built.items():
        cache_name, params = ENTRIES[name.removeprefix("builtin:")]
        assert path.parent == tmp_path / f"{cache_name}-{params.key()}"
    refused = subprocess.run([*command, "nope"], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown built-in 'nope'" in refused.stderr
