"""`scalerl operator`: run the operator from a pod or a laptop, connected as kubectl would be."""

from __future__ import annotations

import asyncio

from scalerl.kube import Kube


def run_operator(
    namespace: str | None, *, liveness: str | None = None, verbose: bool = False
) -> int:
    """Watch every namespace, or only `namespace`; returns when the operator stops."""
    import kopf

    import scalerl.operator  # noqa: F401 - registers the handlers in kopf's default registry
    from scalerl.operator.handlers import images_from_environ

    kopf.configure(verbose=verbose)
    # Connect before starting: a missing kubeconfig is a clear error, not a retry loop.
    memo = kopf.Memo(kube=Kube.connect(), images=images_from_environ())
    asyncio.run(
        kopf.operator(
            registry=kopf.get_default_registry(),
            clusterwide=namespace is None,
            namespaces=[namespace] if namespace else (),
            standalone=True,
            liveness_endpoint=liveness,
            memo=memo,
        )
    )
    return 0
