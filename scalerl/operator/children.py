"""A run's children in the cluster: get-or-create by deterministic name, and removal.

Explicit removal, not only owner references: garbage collection may be slow, and test API servers
have none. Every call here is idempotent, so a handler may be retried or an operator restarted
at any point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalerl.kube import Kube, KubeError
from scalerl.operator import envserver, fitjob, gang, manifests, names
from scalerl.operator import network as policies
from scalerl.operator.manifests import NetworkSettings
from scalerl.operator.objects import Images, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import QUEUE_LABEL, ScaleRLRun

KUEUE_API = "kueue.x-k8s.io/v1beta2"


class StaleWorkload(Exception):  # noqa: N818 - a signal to come back, not a failure
    """A workload of another gang attempt was in the way and is being deleted."""


def ensure_static(
    kube: Kube,
    run: ScaleRLRun,
    owner: Owner,
    network: NetworkSettings,
    attempt: int,
    *,
    images: Images,
    new: bool = False,
) -> list[str]:
    """Create the config, keys, policies, Service and RBAC where missing; keep the config
    current (the budget and replicas may change), the policies on the spec (deleting a role's
    that is needed no more), the Service on gang `attempt` and an OpenEnv server's Deployment on
    its spec. For a `new` run, create straight away (a conflict means it is there already):
    half the round trips on the path a user waits on. Returns what was created."""
    created = []
    # Fresh keys on every call, but only a missing Secret is created: the run keeps its first.
    keys = StreamKeys.generate()
    for obj in manifests.static_children(run, owner, attempt, keys, network, images):
        meta = obj["metadata"]
        # The Secret is never read back: created, a conflict meaning it is there, so the
        # operator needs no permission to read Secrets.
        current = (
            None
            if new or obj["kind"] == "Secret"
            else kube.find(obj["apiVersion"], obj["kind"], owner.namespace, meta["name"])
        )
        if current is None:
            if kube.create(obj) is not None:
                created.append(f"{obj['kind']}/{meta['name']}")
        elif obj["kind"] == "ConfigMap" and current.get("data") != obj["data"]:
            kube.patch("v1", "ConfigMap", owner.namespace, meta["name"], {"data": obj["data"]})
        elif obj["kind"] == "Service" and _selector(current) != _selector(obj):
            select_attempt(kube, owner, attempt)
        elif obj["kind"] == "NetworkPolicy" and _policy(current) != _policy(obj):
            # An operator of another version made it, or the spec now names other trackers,
            # packages or Hub ids: the policy follows (null drops a rule list it no longer has).
            body = {"spec": {"ingress": None, "egress": None, **obj["spec"]}}
            kube.patch(policies.API, "NetworkPolicy", owner.namespace, meta["name"], body)
        elif obj["kind"] == "Deployment" and _served(current) != _served(obj):
            # spec.environment.openenv's replicas, image or port changed: the server follows.
            kube.patch(
                "apps/v1", "Deployment", owner.namespace, meta["name"], {"spec": obj["spec"]}
            )
    if not new:
        _remove_stale_policies(kube, run, owner, network)
    return created


def _remove_stale_policies(
    kube: Kube, run: ScaleRLRun, owner: Owner, network: NetworkSettings
) -> None:
    """Delete the role policies the run has and needs no more (one list; a delete only where
    there is one)."""
    stale = set(policies.stale_policies(run, owner, network))
    if not stale:
        return
    labels = {names.LABEL_RUN: owner.name, names.LABEL_ROLE: "network"}
    listed = kube.list(policies.API, "NetworkPolicy", owner.namespace, labels)
    for name in sorted(stale & {obj["metadata"]["name"] for obj in listed}):
        kube.delete(policies.API, "NetworkPolicy", owner.namespace, name)


def select_attempt(kube: Kube, owner: Owner, attempt: int) -> None:
    """Point the trainer Service at trainer 0 of gang `attempt` (a merge patch: the selector only
    ever gains or changes keys)."""
    selector = manifests.service_selector(owner, attempt)
    body = {"spec": {"selector": selector}}
    kube.patch("v1", "Service", owner.namespace, names.service(owner.name), body)


def attempt_of(obj: dict[str, Any]) -> int | None:
    """The gang attempt a workload Job or its pod belongs to (its label); None for no gang's."""
    value = (obj.get("metadata", {}).get("labels") or {}).get(names.LABEL_ATTEMPT)
    return int(value) if value is not None and value.isdigit() else None


def gang_pods(kube: Kube, owner: Owner, attempt: int) -> list[dict[str, Any]]:
    """The trainer and generator pods of gang `attempt` that are not being deleted."""
    return [
        pod
        for pod in kube.list("v1", "Pod", owner.namespace, _gang_labels(owner, attempt))
        if _role(pod) in names.WORKLOAD_ROLES and not pod["metadata"].get("deletionTimestamp")
    ]


def refused_pods(kube: Kube, owner: Owner, attempt: int) -> str | None:
    """Why the Job controller could not create a pod of gang `attempt` (a quota, Pod Security,
    ...), as its newest FailedCreate Event on the gang's Jobs says; None when it says nothing."""
    gang = _gang_labels(owner, attempt)
    jobs = {job["metadata"]["uid"] for job in kube.list("batch/v1", "Job", owner.namespace, gang)}
    return refused(kube, owner.namespace, jobs)


def refused(kube: Kube, namespace: str, jobs: set[str]) -> str | None:
    """The newest FailedCreate Event's message on the Jobs of these uids: why the Job controller
    could not create their pods; None when there is none."""
    refusals = kube.list(
        "v1", "Event", namespace, {}, {"involvedObject.kind": "Job", "reason": "FailedCreate"}
    )
    mine = [e for e in refusals if e["involvedObject"].get("uid") in jobs]
    newest = max(mine, key=_last_seen, default=None)
    return None if newest is None else str(newest.get("message", ""))


# What the attach-detach controller and the kubelet say of a volume a pod cannot get: a
# ReadWriteOnce claim attached to another node (Multi-Attach), a claim that does not mount.
VOLUME_TROUBLE = ("FailedAttachVolume", "FailedMount")


def volume_trouble(kube: Kube, owner: Owner, pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, `pod <name>: <message>`) of the newest volume Warning Event on one of `pods`
    (pods the kubelet holds in ContainerCreating, whose status says nothing of why); None when
    there is none."""
    names_of = {pod["metadata"]["uid"]: pod["metadata"]["name"] for pod in pods}
    warnings = kube.list(
        "v1", "Event", owner.namespace, {}, {"involvedObject.kind": "Pod", "type": "Warning"}
    )
    mine = [
        e
        for e in warnings
        if e.get("reason") in VOLUME_TROUBLE and e["involvedObject"].get("uid") in names_of
    ]
    newest = max(mine, key=_last_seen, default=None)
    if newest is None:
        return None
    pod = names_of[newest["involvedObject"]["uid"]]
    return str(newest["reason"]), f"pod {pod}: {newest.get('message', '')}"


def _gang_labels(owner: Owner, attempt: int) -> dict[str, str]:
    return {names.LABEL_RUN: owner.name, names.LABEL_ATTEMPT: str(attempt)}


def _last_seen(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


@dataclass
class Workloads:
    """What `ensure_workloads` did: the workloads it created (`Kind/name`), and the size the
    generators' Job had before it was resized (None: not resized)."""

    created: list[str] = field(default_factory=list)
    resized_from: int | None = None


def ensure_workloads(
    kube: Kube, run: ScaleRLRun, owner: Owner, attempt: int, images: Images, *, new: bool = False
) -> Workloads:
    """The gang of `attempt`: its Jobs (a queued run's JobSet) created where missing, and the
    generators' Job resized to spec.generators.replicas (`kubectl scale srl` while it runs).
    One of another attempt is deleted (with its pods) and StaleWorkload raised: the name frees
    up only once it is gone."""
    done = Workloads()
    for obj in gang.workloads(run, owner, attempt, images):
        api_version, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
        current = None if new else kube.find(api_version, kind, owner.namespace, name)
        if current is not None and attempt_of(current) != attempt:
            remove_workloads(kube, owner, queued=run.queue_name is not None)
            raise StaleWorkload(f"{name} belongs to attempt {attempt_of(current)}")
        if current is None:
            if _create_workload(kube, obj) is not None:
                done.created.append(f"{kind}/{name}")
        elif kind == "Job" and _role(obj) == names.ROLE_GENERATOR:
            done.resized_from = _resize(kube, current, obj)
    return done


def _resize(kube: Kube, job: dict[str, Any], wanted: dict[str, Any]) -> int | None:
    """The generators' Job to the size of `wanted` (an Indexed Job's completions and parallelism
    change together: the Job controller starts the new indexes or removes those past the size);
    its size before, None when it had it. Only a Job: a queued run's JobSet keeps the pod sets
    Kueue admitted until its next gang start, and a colocated run has no generators' Job."""
    size, target = job["spec"].get("completions"), wanted["spec"]["completions"]
    if size == target:
        return None
    resized = {"spec": {"completions": target, "parallelism": target}}
    kube.patch(
        job["apiVersion"],
        job["kind"],
        job["metadata"]["namespace"],
        job["metadata"]["name"],
        resized,
    )
    return int(size)


class NoJobSetAPI(Exception):  # noqa: N818 - the cluster's answer, said to the user as it is
    """A queued run's JobSet was refused: the server does not serve JobSets."""


def _create_workload(kube: Kube, obj: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return kube.create(obj)
    except KubeError as err:
        if obj["kind"] == "JobSet" and err.status == 404:
            raise NoJobSetAPI(
                f"spec.scheduling.queueName needs JobSet and Kueue on the cluster, and the API "
                f"server does not serve {gang.JOBSET_API} JobSets ({err}): install JobSet, "
                "and Kueue with its jobset.x-k8s.io/jobset integration, or remove the queue"
            ) from None
        raise


def admission(kube: Kube, owner: Owner, attempt: int) -> tuple[str, str] | None:
    """None once Kueue has admitted the queued gang `attempt` (its JobSet is no longer
    suspended); else (reason, message) of why it waits, as Kueue's Workload for it says (no
    quota yet, a queue that does not exist, an eviction)."""
    jobset = kube.find(gang.JOBSET_API, "JobSet", owner.namespace, names.gang(owner.name))
    if jobset is None or attempt_of(jobset) != attempt:
        return "PodsNotCreated", f"the JobSet of gang attempt {attempt} is not there yet"
    if not (jobset.get("spec") or {}).get("suspend"):
        return None
    queue = (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    waiting = f"waiting for Kueue to admit the gang from queue {queue}"
    workload = _kueue_workload(kube, owner, jobset["metadata"]["uid"])
    if workload is None:
        return "Queued", f"{waiting} (no Kueue Workload for JobSet {names.gang(owner.name)} yet)"
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in ("Evicted", "QuotaReserved"):
        said = conditions.get(kind) or {}
        if said.get("message") and said.get("status") == ("True" if kind == "Evicted" else "False"):
            reason = "Evicted" if kind == "Evicted" else "Queued"
            return reason, f"{waiting}: {said['message']}"
    return "Queued", waiting


def _kueue_workload(kube: Kube, owner: Owner, jobset_uid: str) -> dict[str, Any] | None:
    """Kueue's Workload of the JobSet with `jobset_uid` (it names the JobSet its owner); None
    where there is none (not made yet; no Kueue, or one that does not serve its v1beta2 API)."""
    try:
        workloads = kube.list(KUEUE_API, "Workload", owner.namespace, {})
    except KubeError as err:
        if err.status == 404:
            return None
        raise
    return next(
        (
            w
            for w in workloads
            if any(r.get("uid") == jobset_uid for r in w["metadata"].get("ownerReferences") or [])
        ),
        None,
    )


def remove_workloads(kube: Kube, owner: Owner, *, queued: bool = False) -> int:
    """Delete the gang's Jobs (a `queued` run's JobSet too) and pods; how many objects were
    deleted. Every role's, whatever the placement: a Job that is not there (a colocated run's
    generators) is no error, and a run whose placement changed leaves nothing of its old gang
    behind."""
    deleted = _delete_jobset(kube, owner) if queued else 0
    for role in names.WORKLOAD_ROLES:
        deleted += kube.delete("batch/v1", "Job", owner.namespace, names.workload(owner.name, role))
    return deleted + _delete_pods(kube, owner, names.WORKLOAD_ROLES)


def remove_env_server(kube: Kube, run: ScaleRLRun, owner: Owner) -> int:
    """The OpenEnv server's Deployment, where the run has one (its pods go with it): a suspended
    or ended run runs no rollouts. Its Service stays until the run is deleted."""
    if envserver.env_server_url(run, owner) is None:
        return 0
    return int(kube.delete("apps/v1", "Deployment", owner.namespace, names.env_server(owner.name)))


def _delete_jobset(kube: Kube, owner: Owner) -> int:
    """A queued gang's JobSet, and its Jobs: the next gang's JobSet makes Jobs of the same
    names, which it cannot while garbage collection has yet to remove these."""
    jobs = [names.gang_job(owner.name, role) for role in names.WORKLOAD_ROLES]
    deleted = int(kube.delete(gang.JOBSET_API, "JobSet", owner.namespace, names.gang(owner.name)))
    return deleted + sum(kube.delete("batch/v1", "Job", owner.namespace, job) for job in jobs)


def remove_all(kube: Kube, owner: Owner, fit_jobs: int, *, queued: bool = False) -> int:
    """Every child of the run: gang, fit and initializer Jobs, their pods, config, keys, policy,
    Service, RBAC, and its OpenEnv server's Deployment and Service."""
    jobs = [names.workload(owner.name, role) for role in names.WORKLOAD_ROLES]
    jobs += [names.fit_job(owner.name, number) for number in range(1, fit_jobs + 1)]
    jobs.append(names.initializer(owner.name))  # a run with hf:// sources has one
    deleted = _delete_jobset(kube, owner) if queued else 0
    deleted += sum(kube.delete("batch/v1", "Job", owner.namespace, job) for job in jobs)
    deleted += _delete_pods(kube, owner, None)
    account = names.account(owner.name)
    for api_version, kind, name in (
        ("rbac.authorization.k8s.io/v1", "RoleBinding", account),
        ("rbac.authorization.k8s.io/v1", "Role", account),
        ("v1", "ServiceAccount", account),
        ("v1", "Service", names.service(owner.name)),
        ("apps/v1", "Deployment", names.env_server(owner.name)),  # spec.environment.openenv
        ("v1", "Service", names.env_server(owner.name)),
        ("v1", "ConfigMap", names.config(owner.name)),
        ("v1", "Secret", names.stream_keys(owner.name)),
        ("networking.k8s.io/v1", "NetworkPolicy", names.network_policy(owner.name)),
        *(
            ("networking.k8s.io/v1", "NetworkPolicy", names.egress_policy(owner.name, role))
            for role in policies.EGRESS_ROLES
        ),
    ):
        deleted += kube.delete(api_version, kind, owner.namespace, name)
    return deleted


def _delete_pods(kube: Kube, owner: Owner, roles: tuple[str, ...] | None) -> int:
    """Pods are the Jobs' to delete, but garbage collection may lag (or, in tests, not exist)."""
    deleted = 0
    for pod in kube.list("v1", "Pod", owner.namespace, {names.LABEL_RUN: owner.name}):
        meta = pod["metadata"]
        if (roles is None or _role(pod) in roles) and not meta.get("deletionTimestamp"):
            deleted += kube.delete("v1", "Pod", owner.namespace, meta["name"])
    return deleted


def fit_job_active(kube: Kube, owner: Owner, number: int) -> bool:
    """Whether fit Job `number` exists and has not finished (a finished one may have expired)."""
    if number < 1:
        return False
    job = kube.find("batch/v1", "Job", owner.namespace, names.fit_job(owner.name, number))
    if job is None:
        return False
    status = job.get("status") or {}
    finished = any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return not finished and not status.get("succeeded") and not status.get("completionTime")


def create_fit_job(kube: Kube, run: ScaleRLRun, owner: Owner, number: int, images: Images) -> bool:
    return kube.create(fitjob.fit_job(run, owner, number, images)) is not None


def _served(deployment: dict[str, Any]) -> tuple[Any, ...]:
    """What of the OpenEnv server's Deployment follows the spec: replicas, image, port."""
    spec = deployment.get("spec") or {}
    container = spec["template"]["spec"]["containers"][0]
    return spec.get("replicas"), container.get("image"), container["ports"][0]["containerPort"]


def _policy(policy: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy's spec without its empty rule lists (the API server drops them)."""
    return {key: value for key, value in policy.get("spec", {}).items() if value not in ([], None)}


def _selector(service: dict[str, Any]) -> dict[str, str] | None:
    return (service.get("spec") or {}).get("selector")


def _role(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata", {}).get("labels") or {}).get(names.LABEL_ROLE)
