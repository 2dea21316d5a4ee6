"""`scalerl operator`: run the operator from a pod or a laptop, connected as kubectl would be."""

from __future__ import annotations

import asyncio

from scalerl.kube import Kube
from scalerl.metrics import RunMetrics


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
