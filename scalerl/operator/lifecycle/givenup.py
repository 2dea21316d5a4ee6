"""Generators trainer 0 gave up while their pods ran (`status.generatorsGivenUp`, written by its
status sink, scalerl.status.kubernetes): they sent no rollouts for the peer timeout while the
others sent theirs, or did not join the weight-sync group. One that was only slow reads the
trainer's Stop and exits failed; a frozen one reads nothing, and its pod would run on while the
pool stays short. The operator deletes each such pod, which its Indexed Job replaces as any
deleted generator's (status.generators, GeneratorReplaced), and clears the entry."""

from __future__ import annotations

from typing import Any

from scalerl.operator import names
from scalerl.operator.lifecycle.state import WARNING, Context, status_of


def given_up(run_obj: dict[str, Any]) -> bool:
    """Cheap check on a watch event: are there given-up generators to end? (No API calls.)"""
    return bool(status_of(run_obj).get("generatorsGivenUp"))


def end_given_up(ctx: Context) -> None:
    """Delete the pod of each given-up generator that still runs (a GeneratorGivenUp Event
    each), then clear the entries handled."""
    run_obj = ctx.read()
    if run_obj is None or not given_up(run_obj):
        return
    ctx = ctx.bound(run_obj)
    entries = list(status_of(run_obj)["generatorsGivenUp"])
    namespace, run = ctx.owner.namespace, ctx.owner.name
    generators = {names.LABEL_RUN: run, names.LABEL_ROLE: names.ROLE_GENERATOR}
    for entry in entries:
        pod = str(entry.get("pod", ""))
        named = {"metadata.name": pod}
        found = ctx.kube.list("v1", "Pod", namespace, generators, named) if pod else []
        if not found or found[0]["metadata"].get("deletionTimestamp"):
            continue  # gone already, or not this run's generator
        ctx.kube.delete("v1", "Pod", namespace, pod)
        message = (
            f"generator {entry.get('index', '?')} stopped answering ({entry.get('reason', '')}); "
            f"its pod {pod} is deleted so that its Job replaces it"
        )
        ctx.emit(run_obj, WARNING, "GeneratorGivenUp", message)

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        current = list(status_of(fresh).get("generatorsGivenUp") or [])
        left = [e for e in current if e not in entries]
        return None if left == current else {"generatorsGivenUp": left or None}

    ctx.status.update(change)
