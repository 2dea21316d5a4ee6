"""Fixtures of the agents tests: the environment packages of environments/, installed as a user
installs theirs."""

from __future__ import annotations

import pytest
from editable import install_editable


@pytest.fixture(scope="session")
def environment_packages() -> list[str]:
    """tool-arith and guess-number pip-installed into this venv (editable, offline, without
    their declared verifiers pin: README), so every process of a run imports them; their ids."""
    install_editable("tool_arith", "guess_number")
    return ["tool-arith", "guess-number"]
