"""The one error hierarchy of scalerl.

Every process has a single top-level handler (the CLI) that turns a `ScaleRLError` into one clear
line and a non-zero exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys


class ScaleRLError(Exception):
    """Base of every error we raise on purpose. `str(err)` is the message a user reads."""

    exit_code: int = 1


class InputError(ScaleRLError):
    """The user gave us something we cannot use: a bad spec, file or argument (exit 2)."""

    exit_code = 2


class SpecError(InputError):
    """A ScaleRLRun spec failed validation; holds one message per bad field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class DataError(InputError):
    """A data file (curve, prompts, model directory) is missing, unreadable or malformed."""


class FitError(ScaleRLError):
    """The scaling law could not be fitted to the points given."""

    exit_code = 2


class WeightSyncError(ScaleRLError):
    """A weight broadcast failed or arrived damaged; the receiver keeps its previous version."""


class SandboxUnavailable(ScaleRLError):
    """No sandbox for model-written code can be made here, and the spec did not allow plain
    processes by name (`data.code.unsafeAllowPlain`): the run must not start."""

    exit_code = 3


class PeerError(ScaleRLError):
    """A peer process (trainer or generator) is unreachable or died."""


def report(err: ScaleRLError) -> int:
    """What the top-level handler does with an error: one `error:` line per problem on stderr;
    returns the exit code."""
    for problem in getattr(err, "problems", None) or [str(err)]:
        print(f"error: {problem}", file=sys.stderr)
    return err.exit_code
