"""The environment server a run's rollouts reach: spec.environment.openenv.image run by the
operator as a Deployment and Service of the run, and which pods run the environment."""

from __future__ import annotations

from typing import Any

from scalerl.operator import names
from scalerl.operator.objects import CONTAINER_SECURITY, Images, Owner
from scalerl.spec import OpenEnvEnvironment, ScaleRLRun


def runs_rollouts(run: ScaleRLRun, role_name: str) -> bool:
    """Whether `role_name`'s pods run the environment: the generators, or a colocated run's one
    process."""
    return role_name == names.ROLE_GENERATOR or (
        run.spec.colocated and role_name == names.ROLE_TRAINER
    )


def _server_image(run: ScaleRLRun) -> OpenEnvEnvironment | None:
    """spec.environment.openenv where the operator runs its server (an image, no url)."""
    environment = run.spec.environment
    openenv = None if environment is None else environment.openenv
    if openenv is None or openenv.image is None or openenv.url is not None:
        return None
    return openenv


def env_server_url(run: ScaleRLRun, owner: Owner) -> str | None:
    """The run's OpenEnv server as its rollouts reach it: the `<run>-env` Service."""
    openenv = _server_image(run)
    if openenv is None:
        return None
    return f"http://{names.env_server(owner.name)}.{owner.namespace}.svc:{openenv.port}"


def env_server(run: ScaleRLRun, owner: Owner, images: Images) -> list[dict[str, Any]]:
    """spec.environment.openenv.image's server: a Deployment of `replicas` pods, ready when its
    /health answers (openenv-core's), and a Service before them (each WebSocket session stays
    on the pod it reached). Its pods carry the run's label, so the run's NetworkPolicy lets the
    run's pods, and only them, reach it. A suspended run keeps the Service, not the pods."""
    openenv = _server_image(run)
    if openenv is None:
        return []
    name = names.env_server(owner.name)
    selector = {names.LABEL_RUN: owner.name, names.LABEL_ROLE: names.ROLE_ENV}
    probe = {"httpGet": {"path": "/health", "port": openenv.port}, "periodSeconds": 5}
    container = {
        "name": "server",
        "image": openenv.image,
        "ports": [{"name": "http", "containerPort": openenv.port, "protocol": "TCP"}],
        "readinessProbe": probe,
        "securityContext": CONTAINER_SECURITY,
    }
    pod_spec = {
        "securityContext": images.for_run(run).pod_security(),
        **images.pod_fields(),
        "automountServiceAccountToken": False,  # the server never calls the API
        "containers": [container],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(name, names.ROLE_ENV),
        "spec": {
            "replicas": openenv.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": names.labels(owner.name, names.ROLE_ENV)},
                "spec": pod_spec,
            },
        },
    }
    port = {"name": "http", "port": openenv.port, "targetPort": openenv.port, "protocol": "TCP"}
    server = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.metadata(name, names.ROLE_ENV),
        "spec": {"selector": selector, "ports": [port]},
    }
    return [server] if run.spec.suspend else [server, deployment]
