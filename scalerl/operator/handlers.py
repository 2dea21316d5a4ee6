"""kopf handlers: short, each one calls scalerl.operator.lifecycle under the run's lock.

Handlers are sync functions: kopf runs them in worker threads, where our blocking API client is
at home. One lock per run serializes the handlers of a run (its own events, its pods' events and
the periodic check), so the operator never acts on a run from two threads at once.

Errors are chosen on purpose: a transient API error or a conflict is a TemporaryError (kopf
retries the handler); a request the server refuses (400/403/422: a manifest or RBAC bug) is a
PermanentError, since retrying cannot fix it. A bad spec is no error at all: it is reported in
the run's status and an Event, and the update handler runs again when the spec is fixed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import kopf

from scalerl.errors import InputError
from scalerl.kube import Kube, KubeError
from scalerl.metrics import RunMetrics
from scalerl.operator import lifecycle, names, sweeps, trackrecord
from scalerl.operator.children import StaleWorkload
from scalerl.operator.manifests import Images, NetworkSettings

RUNS = ("scalerl.dev", "v1alpha1", "scalerlruns")
SWEEPS = ("scalerl.dev", "v1alpha1", "scalerlsweeps")
FINALIZER = "scalerl.dev/cleanup"
ANNOTATIONS = "scalerl.dev"  # kopf's bookkeeping annotations live under our own prefix
CHECK_INTERVAL_S = 30.0  # the periodic level-triggered check that catches missed events
DELETE_POLL_S = 1.0  # how often a deletion looks again whether the periodic check has finished
# The children kopf watches (pods and Jobs): all of them carry the run's label.
CHILD_RESOURCES = (("v1", "pods"), ("batch/v1", "jobs"))

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


@contextmanager
def run_lock(namespace: str, name: str) -> Iterator[None]:
    with _locks_guard:
        lock = _locks.setdefault((namespace, name), threading.Lock())
    with lock:
        yield


def images_from_environ() -> Images:
    """Image overrides for the operator's Deployment (the chart sets them)."""
    default = Images()
    return Images(
        trainer=os.environ.get("SCALERL_TRAINER_IMAGE", default.trainer),
        generator=os.environ.get("SCALERL_GENERATOR_IMAGE", default.generator),
        fit=os.environ.get("SCALERL_FIT_IMAGE", default.fit),
        # The initializer runs in the fit's image (the operator's) unless told otherwise.
        initializer=os.environ.get(
            "SCALERL_INITIALIZER_IMAGE", os.environ.get("SCALERL_FIT_IMAGE", default.initializer)
        ),
        pull_secrets=tuple(
            name.strip()
            for name in os.environ.get("SCALERL_IMAGE_PULL_SECRETS", "").split(",")
            if name.strip()
        ),
        run_as=run_as_from_environ(default.run_as),
    )


def run_as_from_environ(default: int | None) -> int | None:
    """SCALERL_RUN_AS_USER: the pods' user ID, or "" where the platform assigns it."""
    raw = os.environ.get("SCALERL_RUN_AS_USER")
    if raw is None:
        return default
    if raw.strip() == "":
        return None
    if not raw.strip().isdigit() or int(raw) == 0:
        raise InputError(f"SCALERL_RUN_AS_USER must be a non-root user ID or empty, got {raw!r}")
    return int(raw)


def network_from_environ() -> NetworkSettings:
    """The runs' NetworkPolicy settings (the chart sets them from its `networkPolicy` values and
    its look-up of the API server's addresses)."""
    enabled = os.environ.get("SCALERL_NETWORK_POLICY", "true").strip().lower()
    if enabled not in ("true", "false"):
        raise InputError(f"SCALERL_NETWORK_POLICY must be true or false, got {enabled!r}")
    default = NetworkSettings()
    ports = _listed("SCALERL_API_SERVER_PORTS", "") or tuple(map(str, default.api_server_ports))
    if not all(port.isdigit() and 0 < int(port) < 65536 for port in ports):
        raise InputError(f"SCALERL_API_SERVER_PORTS must be TCP ports, got {','.join(ports)!r}")
    return NetworkSettings(
        enabled=enabled == "true",
        metrics_namespaces=_listed("SCALERL_METRICS_NAMESPACES", "monitoring"),
        dns_namespaces=_listed("SCALERL_DNS_NAMESPACES", "kube-system"),
        api_server_cidrs=_listed("SCALERL_API_SERVER_CIDRS", ""),
        api_server_ports=tuple(int(port) for port in ports),
    )


def _listed(variable: str, default: str) -> tuple[str, ...]:
    """A comma-separated environment variable's items."""
    raw = os.environ.get(variable, default)
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def export_metrics(metrics: RunMetrics, run: dict[str, Any], deleted: bool) -> None:
    """The run-level gauges (prediction, target, gang restarts, whether its sweep stopped it)
    from the run's own object, and its scored predictions in the operator's track record."""
    meta = run["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if deleted:
        metrics.forget(namespace, name)
        return
    status = run.get("status") or {}
    metrics.set_restarts(namespace, name, int(status.get("restarts") or 0))
    in_sweep = sweeps.LABEL_SWEEP in (meta.get("labels") or {})
    stopped = sweeps.STOPPED_BY in (meta.get("annotations") or {})
    metrics.set_sweep_stopped(namespace, name, stopped if in_sweep else None)
    if status.get("prediction"):
        metrics.set_prediction(namespace, name, status["prediction"])
    scored = trackrecord.scored_predictions(status.get(trackrecord.TRACK_RECORD))
    metrics.track_record.set_run(namespace, name, scored)
    # Read raw, not parsed: a gauge must not wait for an invalid spec to be fixed.
    budget = (run.get("spec") or {}).get("budget") or {}
    stop_when = budget.get("stopWhen") or {}
    metrics.set_targets(
        namespace, name, budget.get("targetPassRate"), stop_when.get("predictedABelow")
    )


def post_event(run: dict[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(
        kopf.Body(cast(kopf.RawBody, run)), type=type_, reason=reason, message=message[:1024]
    )


def act(memo: Any, run: Any, what: Callable[[lifecycle.Context], object]) -> None:
    """Run `what` for the run under its lock; API errors mapped to kopf's retry semantics."""
    meta = run["metadata"]
    owner = lifecycle.owner_of({"metadata": dict(meta)})
    network = getattr(memo, "network", None) or NetworkSettings()
    context = lifecycle.Context(memo.kube, memo.images, owner, post_event, network)
    try:
        with run_lock(owner.namespace, owner.name), kube_errors():
            what(context)
    except StaleWorkload as err:
        raise kopf.TemporaryError(f"waiting for the old gang to go: {err}", delay=2) from None


@contextmanager
def kube_errors() -> Iterator[None]:
    """API errors as kopf's retry semantics: transient ones and conflicts again soon, the rest
    never (the handler's error says what the server refused)."""
    try:
        yield
    except KubeError as err:
        if err.transient or err.conflict:
            raise kopf.TemporaryError(str(err), delay=5) from None
        raise kopf.PermanentError(f"the API server refused: {err}") from None


def act_sweep(memo: Any, sweep: Any, what: Callable[[sweeps.SweepContext], object]) -> None:
    """Run `what` for the sweep under its lock; API errors mapped to kopf's retry semantics."""
    meta = sweep["metadata"]
    context = sweeps.SweepContext(memo.kube, meta["namespace"], meta["name"], post_event)
    with run_lock(meta["namespace"], f"sweep/{meta['name']}"), kube_errors():
        what(context)


def register(
    registry: kopf.OperatorRegistry,
    *,
    check_interval_s: float = CHECK_INTERVAL_S,
    sweep_interval_s: float | None = None,
) -> None:
    """Register every handler of the operator in `registry`: the runs' periodic check every
    `check_interval_s`, the sweeps' every `sweep_interval_s` (default the same)."""
    sweep_every = check_interval_s if sweep_interval_s is None else sweep_interval_s

    @kopf.on.startup(registry=registry, id="configure")
    def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATIONS)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=ANNOTATIONS)
        settings.posting.level = logging.WARNING  # only our explicit Events, no log chatter
        settings.peering.standalone = True  # one replica (Recreate): no peering objects needed
        # A run deleted while its periodic check runs: kopf removes the finalizer only once the
        # check has finished, and by default looks again whether it has every 60 s (a check
        # that writes nothing wakes nothing). A check takes well under a second; a deletion
        # should not wait a minute for one (tests/cluster/test_queue.py's rare 60 s delete;
        # reproduced in test_operator.py's deleted-while-its-check-runs test).
        settings.background.cancellation_polling = DELETE_POLL_S
        # kopf applies a handler's `labels=` filter after the server sent the object; a watch
        # selector is sent with the list and watch requests, so the server sends our children
        # only, not every Pod and Job of the cluster.
        for resource in CHILD_RESOURCES:
            settings.watching.label_selectors[resource] = names.LABEL_RUN
        if getattr(memo, "kube", None) is None:
            memo.kube = Kube.connect(agent=names.MANAGED_BY)
        if getattr(memo, "images", None) is None:
            memo.images = images_from_environ()
        if getattr(memo, "network", None) is None:
            memo.network = network_from_environ()

    @kopf.on.create(*RUNS, registry=registry, id="create")
    def created(body: kopf.Body, memo: Any, **_: Any) -> None:
        act(memo, body, lambda ctx: lifecycle.reconcile(ctx, new=True))

    @kopf.on.resume(*RUNS, registry=registry, id="resume")
    @kopf.on.update(*RUNS, registry=registry, id="update", field="spec")
    @kopf.timer(
        *RUNS,
        registry=registry,
        id="check",
        interval=check_interval_s,
        initial_delay=check_interval_s,
    )
    def reconcile(body: kopf.Body, memo: Any, **_: Any) -> None:
        # A finished run is swept once (whatever of its gang the handler that ended it left
        # behind, had its cleanup been cut off), then costs the periodic check no request. The
        # memo is kopf's per-run one: an operator restart sweeps each finished run once again.
        finished = (body.get("status") or {}).get("phase") in lifecycle.TERMINAL
        if finished and getattr(memo, "swept", False):
            return
        act(memo, body, lifecycle.reconcile)
        memo.swept = finished

    @kopf.on.event(*RUNS, registry=registry, id="status")
    def status_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
        run = _plain(body)
        if getattr(memo, "metrics", None) is not None:
            export_metrics(memo.metrics, run, deleted=type == "DELETED")
        # Every progress patch lands here: decide from the event's own body, without API calls,
        # whether anything may be due before taking the lock and reading afresh.
        if type == "DELETED":
            return
        if lifecycle.wants_action(run):
            act(memo, body, lifecycle.on_status)
        if lifecycle.given_up(run):
            act(memo, body, lifecycle.end_given_up)

    @kopf.on.event(
        "", "v1", "pods", registry=registry, id="pods", labels={names.LABEL_RUN: kopf.PRESENT}
    )
    def pod_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
        pod = _plain(body)
        if type != "DELETED":
            act(memo, _run_of(pod), lambda ctx: lifecycle.on_pod(ctx, pod))

    @kopf.on.event(
        "batch",
        "v1",
        "jobs",
        registry=registry,
        id="fit-jobs",
        labels={names.LABEL_ROLE: names.ROLE_FIT},
    )
    def fit_job_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
        # A finished fit lets the next one start: without this, a fit that fell due while one
        # ran would wait for the next status change, which never comes once the run has ended.
        job = _plain(body)
        if type != "DELETED" and (job.get("status") or {}).get("conditions"):
            act(memo, _run_of(job), lifecycle.on_status)

    @kopf.on.event(
        "batch",
        "v1",
        "jobs",
        registry=registry,
        id="workload-jobs",
        labels={names.LABEL_ROLE: lambda value, **_: value in names.WORKLOAD_ROLES},
    )
    def workload_job_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
        job = _plain(body)
        broken = lifecycle.job_failure(job) is not None or lifecycle.job_suspended(job)
        if type != "DELETED" and broken:
            act(memo, _run_of(job), lambda ctx: lifecycle.on_workload_job(ctx, job))

    def preparation_job_changed(body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
        # A pod of it ended (the initializer's SourcesReady says how) or the Job did: start the
        # gang, or say why the download or the sandbox check failed.
        job = _plain(body)
        ended = job.get("status") or {}
        if type != "DELETED" and (ended.get("failed") or ended.get("conditions")):
            act(memo, _run_of(job), lifecycle.reconcile)

    # The Jobs a run's gang waits for: the initializer's downloads, the sandbox check.
    for role in (names.ROLE_INITIALIZER, names.ROLE_SANDBOX_CHECK):
        kopf.on.event(
            "batch",
            "v1",
            "jobs",
            registry=registry,
            id=f"{role}-jobs",
            labels={names.LABEL_ROLE: role},
        )(preparation_job_changed)

    # A sweep acts on its runs' predictions: the periodic check reads them (a run's status
    # changes every step; a sweep's decisions need not follow each one).
    @kopf.on.create(*SWEEPS, registry=registry, id="sweep-create")
    @kopf.on.resume(*SWEEPS, registry=registry, id="sweep-resume")
    @kopf.on.update(*SWEEPS, registry=registry, id="sweep-update", field="spec")
    @kopf.timer(
        *SWEEPS,
        registry=registry,
        id="sweep-check",
        interval=sweep_every,
        initial_delay=sweep_every,
    )
    def sweep_reconcile(body: kopf.Body, memo: Any, **_: Any) -> None:
        act_sweep(memo, body, sweeps.reconcile)

    @kopf.on.delete(*SWEEPS, registry=registry, id="sweep-delete")
    def sweep_deleted(body: kopf.Body, memo: Any, **_: Any) -> None:
        act_sweep(memo, body, sweeps.cleanup)

    @kopf.on.delete(*RUNS, registry=registry, id="delete")
    def delete(body: kopf.Body, memo: Any, **_: Any) -> None:
        run = _plain(body)
        act(memo, body, lambda ctx: lifecycle.cleanup(ctx, run))


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A plain dict copy of kopf's read-only body view."""
    return _to_plain(body)  # type: ignore[no-any-return]


def _to_plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


def _run_of(child: dict[str, Any]) -> dict[str, Any]:
    """The run a labelled child belongs to, enough to lock it; lifecycle reads it afresh (uid
    included: pods are owned by their Jobs, not by the run)."""
    meta = child["metadata"]
    return {
        "metadata": {
            "name": meta["labels"][names.LABEL_RUN],
            "namespace": meta["namespace"],
            "uid": "",
        }
    }
