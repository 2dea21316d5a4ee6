"""Pure builders: a parsed ScaleRLRun -> the Kubernetes objects that run it (plain dicts).

This module makes the children that live as long as the run (config, stream keys, network policy,
the Service, the status RBAC) and lists them all in creation order (`children`); the others are
each made by the module that owns them: the gang's Jobs by `scalerl.operator.gang`, the fit Job
by `scalerl.operator.fitjob`, the OpenEnv server by `scalerl.operator.envserver`, the hf://
downloads by `scalerl.operator.initializer`; `scalerl.operator.objects` holds what they share.
Their public names are re-exported here for callers that build a run's objects.
"""

from __future__ import annotations

from typing import Any

import yaml

from scalerl.operator import names
from scalerl.operator.envserver import env_server, env_server_url
from scalerl.operator.fitjob import fit_job
from scalerl.operator.gang import ENV_PACKAGES_DIR, JOBSET_API, workload, workload_roles, workloads
from scalerl.operator.network import NetworkSettings, network_policies
from scalerl.operator.network import run_policy as network_policy
from scalerl.operator.objects import (
    CHANNEL_PORT,
    CONFIG_DIR,
    CONTAINER_SECURITY,
    METRICS_PORT,
    RANKS_PORT,
    RUN_AS,
    SPEC_FILE,
    SYNC_PORT,
    Images,
    Owner,
    ports,
)
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import API_VERSION, KIND, ScaleRLRun

__all__ = [
    "CHANNEL_PORT",
    "CONFIG_DIR",
    "CONTAINER_SECURITY",
    "ENV_PACKAGES_DIR",
    "Images",
    "JOBSET_API",
    "METRICS_PORT",
    "NetworkSettings",
    "Owner",
    "RANKS_PORT",
    "RUN_AS",
    "SPEC_FILE",
    "SYNC_PORT",
    "children",
    "config_map",
    "env_server",
    "env_server_url",
    "fit_job",
    "network_policies",
    "network_policy",
    "role",
    "role_binding",
    "run_document",
    "service",
    "service_account",
    "service_selector",
    "static_children",
    "stream_keys_secret",
    "workload",
    "workload_roles",
    "workloads",
]

# The chart's default images (frozen: one value serves every call that names none).
DEFAULT_IMAGES = Images()
DEFAULT_NETWORK = NetworkSettings()


def children(
    run: ScaleRLRun,
    owner: Owner,
    attempt: int,
    images: Images,
    keys: StreamKeys,
    network: NetworkSettings = DEFAULT_NETWORK,
) -> list[dict[str, Any]]:
    """Everything a running run has, in creation order (the workloads last)."""
    return [
        *static_children(run, owner, attempt, keys, network, images),
        *workloads(run, owner, attempt, images),
    ]


def static_children(
    run: ScaleRLRun,
    owner: Owner,
    attempt: int,
    keys: StreamKeys,
    network: NetworkSettings = DEFAULT_NETWORK,
    images: Images = DEFAULT_IMAGES,
) -> list[dict[str, Any]]:
    """Children that live as long as the run: config, stream keys, network policy, Service and
    the status RBAC (the Service selects gang `attempt`), and an OpenEnv server's Deployment and
    Service (spec.environment.openenv.image). The policy comes before any pod, so no pod is ever
    unprotected."""
    return [
        config_map(run, owner),
        stream_keys_secret(owner, keys),
        *network_policies(run, owner, network),
        service_account(owner),
        role(owner),
        role_binding(owner),
        service(owner, attempt),
        *env_server(run, owner, images),
    ]


def run_document(run: ScaleRLRun, namespace: str) -> dict[str, Any]:
    """The ScaleRLRun the processes read: the spec as parsed, every default filled in."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": run.name, "namespace": namespace},
        "spec": run.spec.model_dump(by_alias=True, mode="json"),
    }


def config_map(run: ScaleRLRun, owner: Owner) -> dict[str, Any]:
    text = yaml.safe_dump(run_document(run, owner.namespace), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.metadata(names.config(owner.name), "config"),
        "data": {SPEC_FILE: text},
    }


def stream_keys_secret(owner: Owner, keys: StreamKeys) -> dict[str, Any]:
    """The rollout stream's CURVE keys; every gang attempt mounts the same Secret.

    Made for every run, colocated ones too, though their pod mounts none (see `workload`): the
    static children stay one set whatever the placement, and an unused Secret costs nothing."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": owner.metadata(names.stream_keys(owner.name), "keys"),
        "type": "Opaque",
        "stringData": keys.text(),
    }


def service_selector(owner: Owner, attempt: int) -> dict[str, str]:
    """Trainer 0 of gang `attempt`. The attempt matters: with publishNotReadyAddresses a
    terminating pod stays a ready endpoint, so without it the DNS name would still answer with
    the old gang's trainer 0 while a restarted gang meets."""
    return {
        names.LABEL_RUN: owner.name,
        names.LABEL_ROLE: names.ROLE_TRAINER,
        names.LABEL_JOB_INDEX: "0",
        names.LABEL_ATTEMPT: str(attempt),
    }


def service(owner: Owner, attempt: int) -> dict[str, Any]:
    """Headless: its DNS name resolves straight to trainer 0's pod of the current gang attempt,
    which binds the ports. One name for every attempt: the pods' SCALERL_TRAINER_HOST and
    subdomain never change; the operator moves the selector when it starts a new attempt."""
    selector = service_selector(owner, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(names.service(owner.name), names.ROLE_TRAINER),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            # Peers rendezvous before anything is "ready"; there is no readiness to wait for.
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in ports()
            ],
        },
    }


def service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": owner.metadata(names.account(owner.name), "status"),
    }


def role(owner: Owner) -> dict[str, Any]:
    """The run's processes may read and patch this run's status, and nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": owner.metadata(names.account(owner.name), "status"),
        "rules": [
            {
                "apiGroups": [API_VERSION.split("/")[0]],
                "resources": ["scalerlruns/status"],
                "resourceNames": [owner.name],
                "verbs": ["get", "patch"],
            }
        ],
    }


def role_binding(owner: Owner) -> dict[str, Any]:
    account = names.account(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": owner.metadata(account, "status"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
    }
