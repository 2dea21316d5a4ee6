"""The registry of built-in names a spec may use instead of a path: `builtin:NAME` is a model
directory, `builtin:NAME/train` and `builtin:NAME/validation` its data files.

Only the named built-in is built (on first use, then cached), so a run of one never pays for
another's build; torch is imported only then, so resolving stays light until it must build.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl.errors import DataError

if TYPE_CHECKING:
    from scalerl.demo.assets import DemoAssets

PREFIX = "builtin:"
# Name suffix -> the DemoAssets field it stands for.
PARTS = {"": "model_path", "/train": "train_path", "/validation": "validation_path"}


def _demo() -> DemoAssets:
    from scalerl.demo.assets import default_cache_dir, prepare_demo

    return prepare_demo(default_cache_dir())


def _chat_arith() -> DemoAssets:
    from scalerl.demo.assets import default_cache_dir, prepare_chat_arith

    return prepare_chat_arith(default_cache_dir())


def _chat_arith_25m() -> DemoAssets:
    from scalerl.demo.assets import CHAT_ARITH_25M, default_cache_dir, prepare_chat_arith

    return prepare_chat_arith(default_cache_dir(), CHAT_ARITH_25M)


def _code() -> DemoAssets:
    from scalerl.demo.assets import default_cache_dir
    from scalerl.demo.code_assets import prepare_code

    return prepare_code(default_cache_dir())


def _math_code() -> DemoAssets:
    from scalerl.demo.assets import default_cache_dir
    from scalerl.demo.math_code import prepare_math_code

    return prepare_math_code(default_cache_dir())


def _tool_arith() -> DemoAssets:
    from scalerl.demo.assets import default_cache_dir
    from scalerl.demo.tool_arith import tool_arith_assets

    return tool_arith_assets(default_cache_dir())


BUILDERS: dict[str, Callable[[], DemoAssets]] = {
    "demo": _demo,
    "chat-arith": _chat_arith,
    "chat-arith-25m": _chat_arith_25m,
    "code": _code,
    "math-code": _math_code,
    "tool-arith": _tool_arith,
}
# Built-ins that are a model only: their data comes from an environment package (spec.environment).
MODEL_ONLY = {"tool-arith": "environments/tool_arith"}


def known_names() -> list[str]:
    return [
        f"{PREFIX}{name}{part}"
        for name in BUILDERS
        for part in PARTS
        if not (part and name in MODEL_ONLY)
    ]


def is_builtin(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve_builtin(value: str) -> Path:
    """The path a `builtin:` name stands for, building its built-in on first use."""
    name, slash, part = value.removeprefix(PREFIX).partition("/")
    suffix = slash + part
    if not is_builtin(value) or name not in BUILDERS or suffix not in PARTS:
        raise DataError(f"{value!r}: unknown built-in; use one of {', '.join(known_names())}")
    if suffix and name in MODEL_ONLY:
        raise DataError(
            f"{value!r}: builtin:{name} is a model only; its prompts come from the verifiers "
            f"environment in {MODEL_ONLY[name]} (spec.environment), not from a data file"
        )
    path: Path = getattr(BUILDERS[name](), PARTS[suffix])
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m scalerl.demo.builtins [NAME ...]`: build the named built-ins (default: all but
    chat-arith-25m, which only the TRL bench uses) into the cache and print each one's model
    folder; instant for those already built. `make test` runs it first, so that no test's
    timeout pays a built-in's one-time warm-up (minutes on 2 cores for the trained ones)."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description="Build built-ins into the cache.")
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BUILDERS))
    names = parser.parse_args(argv).names or [n for n in BUILDERS if n != "chat-arith-25m"]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown built-in {unknown[0]!r}; use one of {', '.join(BUILDERS)}")
    for name in names:
        started = time.monotonic()
        path = resolve_builtin(PREFIX + name)
        print(f"builtin:{name} {path} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
