"""Deterministic names and labels of a run's children.

Every child's name derives from the run's name, so an operator that restarts (or a handler that
retries) finds what it already made instead of making it twice.
"""

from __future__ import annotations

import re

LABEL_RUN = "scalerl.dev/run"
LABEL_ROLE = "scalerl.dev/role"
LABEL_ATTEMPT = "scalerl.dev/attempt"  # the gang attempt (status.restarts) a workload belongs to
# Set by the Job controller on an Indexed Job's pods (Kubernetes >= 1.28).
LABEL_JOB_INDEX = "batch.kubernetes.io/job-completion-index"
MANAGED_BY = "scalerl-operator"

ROLE_TRAINER = "trainer"
ROLE_GENERATOR = "generator"
ROLE_FIT = "fit"
# The roles that may have a Job (a colocated run has only the trainer's).
WORKLOAD_ROLES = (ROLE_TRAINER, ROLE_GENERATOR)

# An Indexed Job pod's hostname is "<job>-<index>", a DNS label (<= 63): "<run>-generator-" plus
# up to 5 digits of index leaves 47 characters for the run. Services need a leading letter.
MAX_RUN_NAME = 47
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,45}[a-z0-9])?$"
_RUN_NAME = re.compile(RUN_NAME_PATTERN)


def config(run: str) -> str:
    return f"{run}-config"


def service(run: str) -> str:
    """The headless Service of trainer 0: its DNS name is the trainer host of every process."""
    return f"{run}-trainer"


def stream_keys(run: str) -> str:
    """The Secret with the rollout stream's CURVE keys."""
    return f"{run}-stream-keys"


def network_policy(run: str) -> str:
    return f"{run}-network"


def workload(run: str, role: str) -> str:
    return f"{run}-{role}"


def fit_job(run: str, number: int) -> str:
    return f"{run}-fit-{number}"


def account(run: str) -> str:
    """ServiceAccount, Role and RoleBinding share this name."""
    return f"{run}-status"


def labels(run: str, role: str) -> dict[str, str]:
    return {
        LABEL_RUN: run,
        LABEL_ROLE: role,
        "app.kubernetes.io/name": "scalerl",
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def name_problems(run: str) -> list[str]:
    """Why `run` cannot name a run in a cluster (scalerl.spec accepts any DNS label)."""
    if _RUN_NAME.match(run):
        return []
    return [
        f"metadata.name: {run!r} must start with a letter, use a-z, 0-9 and '-', and have at "
        f"most {MAX_RUN_NAME} characters in a cluster (child names append '-generator-<index>')"
    ]
