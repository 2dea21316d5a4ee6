"""A run's NetworkPolicies judged as a network plugin applies them (tests/netpolicy.py): for a
pod of the run, may it open a connection to this address and port? Each test reads as a user's
question: may the generator talk to the Internet? may the trainer reach the MLflow server the
spec names?"""

from __future__ import annotations

from typing import Any

import pytest
from netpolicy import Pod, admits, reaches
from small_run import run_manifest

from scalerl.errors import InputError
from scalerl.operator import manifests, names, network
from scalerl.operator.handlers import network_from_environ
from scalerl.operator.manifests import Images, NetworkSettings, Owner
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import ScaleRLRun, parse_run

OWNER = Owner("r1", "research", "uid-1")
KEYS = StreamKeys.generate()
API_SERVER = NetworkSettings(api_server_cidrs=("10.96.0.1/32", "172.18.0.2/32"))

# Somewhere outside the cluster (a public tracker, PyPI, the Hub): Kubernetes sees an address.
INTERNET = "203.0.113.7"


def run_pod(role: str, run: str = OWNER.name) -> Pod:
    return Pod(names.labels(run, role), OWNER.namespace)


DNS_SERVER = Pod({"k8s-app": "kube-dns"}, namespace="kube-system")
A_POD_ELSEWHERE = Pod({"app": "something"}, namespace="default")


def policies_of(run: ScaleRLRun, settings: NetworkSettings = API_SERVER) -> list[dict[str, Any]]:
    return [
        obj
        for obj in manifests.children(run, OWNER, 0, Images(), KEYS, settings)
        if obj["kind"] == "NetworkPolicy"
    ]


def a_run(**spec: Any) -> ScaleRLRun:
    return parse_run(run_manifest(OWNER.namespace, OWNER.name, **spec))


ROLES = (names.ROLE_TRAINER, names.ROLE_GENERATOR, names.ROLE_FIT, names.ROLE_INITIALIZER)


def test_a_run_naming_no_outside_host_reaches_only_its_peers_dns_and_the_api_server() -> None:
    policies = policies_of(a_run())
    for role in (*ROLES, names.ROLE_ENV):
        pod = run_pod(role)
        # Its run's peers on any port (the stream, the stores, gloo and NCCL's own ports).
        for port in (5555, 29500, 29400, 41234):
            assert reaches(policies, pod, run_pod(names.ROLE_TRAINER), port), (role, port)
        assert reaches(policies, pod, DNS_SERVER, 53, "UDP"), role
        assert reaches(policies, pod, DNS_SERVER, 53, "TCP"), role
        assert not reaches(policies, pod, DNS_SERVER, 8080), role  # only DNS there
        # Nothing outside, no other run, no other namespace's pods.
        for port in (443, 80, 5000):
            assert not reaches(policies, pod, INTERNET, port), (role, port)
        assert not reaches(policies, pod, run_pod(names.ROLE_TRAINER, run="r2"), 5555), role
        assert not reaches(policies, pod, A_POD_ELSEWHERE, 443), role
    # The API server: the pods that run as the run's ServiceAccount, and only them.
    for role in ROLES:
        calls_api = role in (names.ROLE_TRAINER, names.ROLE_FIT)  # no initializer: no hf://
        for address, port in (("10.96.0.1", 443), ("172.18.0.2", 6443)):
            assert reaches(policies, run_pod(role), address, port) is calls_api, role
        assert not reaches(policies, run_pod(role), "10.96.0.2", 443), role
    assert [p["metadata"]["name"] for p in policies] == [
        "r1-network",
        "r1-egress-trainer",
        "r1-egress-fit",
    ]


def test_trackers_open_their_ports_outside_to_the_trainer_and_the_fit_only() -> None:
    tracking = {
        "mlflow": {"uri": "https://mlflow.example.com:8443"},
        "wandb": {"mode": "online"},
        "tensorboard": {},  # files: no network
    }
    policies = policies_of(a_run(tracking=tracking))
    for role in (names.ROLE_TRAINER, names.ROLE_FIT):
        assert reaches(policies, run_pod(role), INTERNET, 8443), role  # MLflow's port
        assert reaches(policies, run_pod(role), INTERNET, 443), role  # W&B
        assert reaches(policies, run_pod(role), "2001:db8::1", 443), role  # IPv6 too
        # A tracker served inside the cluster (another namespace) on the same ports.
        assert reaches(policies, run_pod(role), A_POD_ELSEWHERE, 8443), role
        assert not reaches(policies, run_pod(role), INTERNET, 22), role
    for role in (names.ROLE_GENERATOR, names.ROLE_ENV):
        assert not reaches(policies, run_pod(role), INTERNET, 443), role
        assert not reaches(policies, run_pod(role), INTERNET, 8443), role


@pytest.mark.parametrize(
    ("tracking", "ports"),
    [
        ({"mlflow": {"uri": "http://mlflow.tools.svc"}}, (80,)),
        ({"mlflow": {"uri": "sqlite:///mlflow.db"}}, ()),
        ({"mlflow": {"uri": "postgresql+psycopg2://db/mlflow"}}, ()),
        ({"mlflow": {}}, (80, 443, 5000)),  # MLFLOW_TRACKING_URI is in the Secret
        ({"wandb": {"mode": "offline"}}, ()),
        ({"trackio": {}}, ()),  # local files
        ({"trackio": {}, "secretRef": {"name": "t"}}, (443,)),  # a Space, maybe
        ({"tensorboard": {}}, ()),
    ],
)
def test_each_tracker_opens_the_port_its_spec_implies(
    tracking: dict[str, Any], ports: tuple[int, ...]
) -> None:
    run = a_run(tracking=tracking)
    assert network.tracker_ports(run) == ports
    policies = policies_of(run)
    for port in (22, 80, 443, 5000, 8443):
        assert reaches(policies, run_pod(names.ROLE_TRAINER), INTERNET, port) is (port in ports)


def test_hub_ids_open_the_hub_to_the_initializer_alone() -> None:
    run = a_run(model={"path": "hf://Qwen/Qwen3-0.6B"})
    policies = policies_of(run)
    initializer = run_pod(names.ROLE_INITIALIZER)
    assert reaches(policies, initializer, INTERNET, 443)
    assert reaches(policies, initializer, "10.96.0.1", 443)  # writes status.sources
    assert not reaches(policies, initializer, INTERNET, 80)
    # The gang reads the claim's copy, offline.
    for role in (names.ROLE_TRAINER, names.ROLE_GENERATOR, names.ROLE_FIT):
        assert not reaches(policies, run_pod(role), INTERNET, 443), role
    mirror = a_run(model={"path": "hf://Qwen/Qwen3-0.6B"}, hub={"endpoint": "http://hf.lan:8080"})
    mirrored = policies_of(mirror)
    assert reaches(mirrored, initializer, INTERNET, 8080)
    assert not reaches(mirrored, initializer, INTERNET, 443)


def test_environment_packages_and_an_openenv_url_open_to_the_pods_that_run_rollouts() -> None:
    environment = {
        "openenv": {"url": "http://calculator.tools.svc:8000"},
        "packages": ["calculator-env==1.0"],
        "indexUrl": "https://pypi.internal.example:8443/simple",
    }
    policies = policies_of(a_run(environment=environment))
    generator = run_pod(names.ROLE_GENERATOR)
    assert reaches(policies, generator, INTERNET, 8443)  # the index
    assert reaches(policies, generator, A_POD_ELSEWHERE, 8000)  # the server, in the cluster
    assert not reaches(policies, generator, INTERNET, 443)
    assert not reaches(policies, generator, "10.96.0.1", 443)  # generators never call the API
    assert not reaches(policies, run_pod(names.ROLE_TRAINER), INTERNET, 8443)
    # Colocated: the one (trainer) pod runs the rollouts, and no generator policy is made.
    colocated = a_run(environment=environment, placement="colocated", generators={"replicas": 1})
    together = policies_of(colocated)
    assert reaches(together, run_pod(names.ROLE_TRAINER), INTERNET, 8443)
    assert "r1-egress-generator" not in {p["metadata"]["name"] for p in together}
    # pip's default index (PyPI) where the spec names none; 80 too for an index in a Secret.
    assert network.rollout_ports(a_run(environment={**environment, "indexUrl": None})) == (
        443,
        8000,
    )
    secret = {**environment, "indexUrl": None, "indexSecret": {"name": "pip"}}
    assert network.rollout_ports(a_run(environment=secret)) == (80, 443, 8000)


def test_without_known_api_server_addresses_the_api_ports_are_open_to_any_address() -> None:
    policies = policies_of(a_run(), NetworkSettings(api_server_ports=(443,)))
    assert reaches(policies, run_pod(names.ROLE_TRAINER), INTERNET, 443)
    assert not reaches(policies, run_pod(names.ROLE_TRAINER), INTERNET, 6443)
    assert not reaches(policies, run_pod(names.ROLE_GENERATOR), INTERNET, 443)


def test_dns_anywhere_when_no_dns_namespace_is_named() -> None:
    policies = policies_of(a_run(), NetworkSettings(dns_namespaces=()))
    assert reaches(policies, run_pod(names.ROLE_GENERATOR), "169.254.20.10", 53, "UDP")
    assert not reaches(policies, run_pod(names.ROLE_GENERATOR), "169.254.20.10", 443)


def test_ingress_still_admits_the_run_and_monitoring_only() -> None:
    policies = policies_of(a_run())
    prometheus = Pod({"app": "prometheus"}, "monitoring")
    for role in (names.ROLE_TRAINER, names.ROLE_GENERATOR, names.ROLE_ENV):
        pod = run_pod(role)
        assert admits(policies, pod, run_pod(names.ROLE_GENERATOR), 29500), role
        assert not admits(policies, pod, run_pod(names.ROLE_GENERATOR, run="r2"), 29500), role
        assert admits(policies, pod, prometheus, manifests.METRICS_PORT), role
        assert not admits(policies, pod, prometheus, 5555), role
        assert not admits(policies, pod, A_POD_ELSEWHERE, manifests.METRICS_PORT), role
        assert not admits(policies, pod, INTERNET, 5555), role


def test_stale_role_policies_are_those_the_spec_no_longer_needs() -> None:
    with_packages = a_run(environment={"openenv": {"url": "http://e:8000"}, "packages": ["x"]})
    assert network.stale_policies(with_packages, OWNER, API_SERVER) == ["r1-egress-initializer"]
    assert network.stale_policies(a_run(), OWNER, API_SERVER) == [
        "r1-egress-generator",
        "r1-egress-initializer",
    ]
    # Switched off: the operator leaves whatever is there alone, as it always has.
    assert network.stale_policies(a_run(), OWNER, NetworkSettings(enabled=False)) == []


def test_the_chart_settings_reach_the_operator_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCALERL_DNS_NAMESPACES", "kube-system, openshift-dns")
    monkeypatch.setenv("SCALERL_API_SERVER_CIDRS", "10.96.0.1/32,172.18.0.2/32")
    monkeypatch.setenv("SCALERL_API_SERVER_PORTS", "443,6443")
    settings = network_from_environ()
    assert settings.dns_namespaces == ("kube-system", "openshift-dns")
    assert settings.api_server_cidrs == ("10.96.0.1/32", "172.18.0.2/32")
    assert settings.api_server_ports == (443, 6443)
    monkeypatch.setenv("SCALERL_API_SERVER_PORTS", "443,https")
    with pytest.raises(InputError, match="SCALERL_API_SERVER_PORTS"):
        network_from_environ()
