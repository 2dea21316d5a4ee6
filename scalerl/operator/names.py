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
ROLE_INITIALIZER = "initializer"  # downloads the run's hf:// sources before its gang starts
ROLE_SANDBOX_CHECK = "sandbox-check"  # makes one sandbox before a code-scoring run's gang
ROLE_ENV = "env"  # spec.environment.openenv.image's server: a Deployment and its Service
# The roles that may have a Job (a colocated run has only the trainer's).
WORKLOAD_ROLES = (ROLE_TRAINER, ROLE_GENERATOR)

# An Indexed Job pod's hostname is "<job>-<index>", a DNS label (<= 63): "<run>-generator-" plus
# up to 5 digits of index leaves 47 characters for the run. Services need a leading letter.
MAX_RUN_NAME = 47
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,45}[a-z0-9])?$"
_RUN_NAME = re.compile(RUN_NAME_PATTERN)
# A queued run's gang is a JobSet named as the run; its Jobs are "<run>-<role>-0", two more
# characters in every pod's hostname.
MAX_QUEUED_RUN_NAME = MAX_RUN_NAME - 2
ROLE_GANG = "gang"


def config(run: str) -> str:
    return f"{run}-config"


def service(run: str) -> str:
    """The headless Service of trainer 0: its DNS name is the trainer host of every process."""
    return f"{run}-trainer"


def stream_keys(run: str) -> str:
    """The Secret with the rollout stream's CURVE keys."""
    return f"{run}-stream-keys"


def network_policy(run: str) -> str:
    """The policy over every pod of the run (scalerl.operator.network)."""
    return f"{run}-network"


def egress_policy(run: str, role: str) -> str:
    """What `role`'s pods reach beyond the run's own pods and DNS (scalerl.operator.network)."""
    return f"{run}-egress-{role}"


def workload(run: str, role: str) -> str:
    return f"{run}-{role}"


def gang(run: str) -> str:
    """A queued run's JobSet: its whole gang, one Kueue workload."""
    return run


def gang_job(run: str, role: str) -> str:
    """The Job JobSet makes of a queued gang's `role` (its replicated Job's first and only)."""
    return f"{gang(run)}-{role}-0"


def fit_job(run: str, number: int) -> str:
    return f"{run}-fit-{number}"


def initializer(run: str) -> str:
    return f"{run}-initializer"


def sandbox_check(run: str) -> str:
    """The Job that makes one sandbox before a code-scoring run's gang (sandboxcheck.py)."""
    return f"{run}-sandbox-check"


def env_server(run: str) -> str:
    """The OpenEnv server's Deployment and Service (spec.environment.openenv.image)."""
    return f"{run}-env"


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


def name_problems(run: str, *, queued: bool = False) -> list[str]:
    """Why `run` cannot name a run in a cluster (scalerl.spec accepts any DNS label); a queued
    run's gang is a JobSet, whose pods' names are two characters longer."""
    most = MAX_QUEUED_RUN_NAME if queued else MAX_RUN_NAME
    if _RUN_NAME.match(run) and len(run) <= most:
        return []
    longest = "-generator-0-<index>" if queued else "-generator-<index>"
    return [
        f"metadata.name: {run!r} must start with a letter, use a-z, 0-9 and '-', and have at "
        f"most {most} characters in a cluster (child names append '{longest}')"
    ]
