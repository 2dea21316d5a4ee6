"""`scalerl operator`: run the operator from a pod or a laptop, connected as kubectl would be."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from scalerl.kube import Kube
from scalerl.metrics import RunMetrics

if TYPE_CHECKING:
    import kopf

GLOB = set("*?[]!,")  # what makes a kopf namespace argument a pattern, not a name


def run_operator(
    namespaces: list[str],
    *,
    liveness: str | None = None,
    metrics_port: int = 0,
    verbose: bool = False,
) -> int:
    """Watch every namespace, or only `namespaces`; returns when the operator stops."""
    import kopf

    import scalerl.operator  # noqa: F401 - registers the handlers in kopf's default registry
    from scalerl.operator.handlers import images_from_environ, network_from_environ
    from scalerl.operator.names import MANAGED_BY

    kopf.configure(verbose=verbose)
    only_these_namespaces(kopf.get_default_registry(), namespaces)
    # Connect and read the settings before starting: a missing kubeconfig or a bad setting is a
    # clear error, not a retry loop.
    memo = kopf.Memo(
        kube=Kube.connect(agent=MANAGED_BY),
        images=images_from_environ(),
        network=network_from_environ(),
    )
    if metrics_port:
        memo.metrics = RunMetrics()
        memo.metrics.serve(metrics_port, addr="0.0.0.0")  # noqa: S104 - scraped from outside
    asyncio.run(
        kopf.operator(
            registry=kopf.get_default_registry(),
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=liveness,
            memo=memo,
        )
    )
    return 0


def only_these_namespaces(registry: kopf.OperatorRegistry, namespaces: list[str]) -> None:
    """An operator given exact namespaces does not list the cluster's namespaces to find them.

    kopf lists and watches namespaces whenever it is not cluster-wide (to match glob patterns),
    and the chart's ClusterRole grants neither: every start would log 403s and wait out kopf's
    retries before falling back to the names it was given. With exact names there is nothing to
    discover, so scanning is off (which also means a CRD installed after the start is noticed only
    on a restart; the chart installs it first)."""
    import kopf

    if not namespaces or any(set(ns) & GLOB for ns in namespaces):
        return

    @kopf.on.startup(registry=registry, id="exact-namespaces")
    def exact(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.scanning.disabled = True
