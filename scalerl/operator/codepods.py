"""The pods that run model-written code (`reward: code`): which role's pods they are, and what
they get beyond every pod's restricted settings so that the sandbox can be made there. Read by
the gang's workloads and by the sandbox check, which mirrors them (sandboxcheck.py)."""

from __future__ import annotations

from typing import Any

from scalerl.operator import names
from scalerl.spec import ReplicaSpec, ScaleRLRun


def scores_code(run: ScaleRLRun) -> bool:
    """Whether the run scores model-written code (its spec's or a source's reward is `code`)."""
    return "code" in run.spec.data.rewards()


def scoring_role(run: ScaleRLRun) -> tuple[str, ReplicaSpec]:
    """The role whose pods run the programs: the generators, or a colocated run's one role."""
    if run.spec.colocated:
        return names.ROLE_TRAINER, run.spec.trainers
    return names.ROLE_GENERATOR, run.spec.generators


def code_pod_fields(run: ScaleRLRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod fields, container securityContext fields) the pods that run programs add: a user
    namespace of their own and an unmasked /proc where `data.code.unmaskedProc` asks for them
    (the sandbox then mounts a /proc of its own for each program); none otherwise."""
    if not (scores_code(run) and run.spec.data.code.unmasked_proc):
        return {}, {}
    return {"hostUsers": False}, {"procMount": "Unmasked"}
