"""The `k8s` fixture: an emulated Kubernetes API on 127.0.0.1 that kopf and kubectl both use.

The emulator (see emulator.py) runs in a thread with its own event loop, so that blocking
`kubectl` calls, a kopf operator in the test's event loop or in a thread, and the test itself
can all talk to it at once. Helpers reach tests through the fixture object (importing from a
conftest is fragile).

    def test_something(k8s: Cluster) -> None:
        k8s.install_crd(crd)                       # or: k8s.kubectl("apply", "-f", path)
        k8s.kubectl("apply", "-f", "-", input=yaml_text)
        with k8s.operator(registry):               # kopf in a thread, stopped at exit
            k8s.wait_for(lambda: k8s.get("cm", "x"))
        assert [c for c in k8s.requests if c.is_write]

kopf can also run in the test's own event loop (an async test): start
`kopf.operator(registry=…, standalone=True, clusterwide=True, stop_flag=asyncio.Event())` as a
task, and use `await k8s.kubectl_async(…)` and `await k8s.wait_for_async(…)`, which do not block
the loop; set the flag and await the task at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from emulator_cluster import Cluster, ServerThread
from rbaccheck import denied


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[Cluster]:
    server = ServerThread()
    emulator, url = server.start()
    try:
        yield Cluster(server, emulator, url, tmp_path)
    finally:
        server.stop(emulator)
    assert not emulator.failures, f"the emulator failed internally: {emulator.failures!r}"
    # Whatever a test made the operator do, the chart's ClusterRole must allow it.
    refused = denied(emulator.api_calls)
    assert not refused, f"the chart's ClusterRole refuses operator requests: {refused}"
