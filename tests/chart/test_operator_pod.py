"""The operator's own pod as the chart renders it: its NetworkPolicy (judged with
tests/netpolicy.py, as a network plugin applies it), its readiness probe and CPU limit, and its
image by digest."""

from __future__ import annotations

from typing import Any

import pytest
from helmchart import NAMESPACE, of_kind, one, render
from netpolicy import Pod, admits, reaches

from scalerl.operator import names

DIGEST = "sha256:" + "ab" * 32
PROMETHEUS = Pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")
DNS_SERVER = Pod({"k8s-app": "kube-dns"}, "kube-system")
INTERNET = "203.0.113.7"


def operator_pod(objs: list[dict[str, Any]]) -> Pod:
    """The operator's pod as the Deployment makes it (its template's labels)."""
    labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return Pod(dict(labels), NAMESPACE)


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(found)


def environ(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objs)["env"]}


def test_the_operators_policy_admits_only_the_scrape_of_its_metrics() -> None:
    objs = render({"networkPolicy": {"metricsNamespaces": ["monitoring", "observability"]}})
    policies = of_kind(objs, "NetworkPolicy")
    pod = operator_pod(objs)
    assert admits(policies, pod, PROMETHEUS, 9090)
    assert admits(policies, pod, Pod({"app": "vm"}, "observability"), 9090)
    assert not admits(policies, pod, PROMETHEUS, 8080)  # the probes are the kubelet's
    assert not admits(policies, pod, Pod({"app": "x"}, NAMESPACE), 9090)
    assert not admits(policies, pod, INTERNET, 9090)
    # A run's pod is no operator: the policy leaves it to the run's own.
    assert all(
        not p["spec"]["podSelector"]["matchLabels"].keys() & {names.LABEL_RUN} for p in policies
    )
    moved = render({"operator": {"metricsPort": 9191}})
    assert admits(of_kind(moved, "NetworkPolicy"), operator_pod(moved), PROMETHEUS, 9191)
    assert not admits(of_kind(moved, "NetworkPolicy"), operator_pod(moved), PROMETHEUS, 9090)
    closed = render({"networkPolicy": {"metricsNamespaces": []}})
    assert not admits(of_kind(closed, "NetworkPolicy"), operator_pod(closed), PROMETHEUS, 9090)


def test_the_operator_reaches_the_api_server_and_dns_only() -> None:
    api = {"cidrs": ["10.96.0.1/32", "172.18.0.2/32"], "ports": [443, 6443]}
    objs = render({"networkPolicy": {"apiServer": api}})
    policies, pod = of_kind(objs, "NetworkPolicy"), operator_pod(objs)
    assert reaches(policies, pod, "10.96.0.1", 443)
    assert reaches(policies, pod, "172.18.0.2", 6443)
    assert reaches(policies, pod, DNS_SERVER, 53, "UDP")
    assert reaches(policies, pod, DNS_SERVER, 53, "TCP")
    assert not reaches(policies, pod, "10.96.0.2", 443)
    assert not reaches(policies, pod, INTERNET, 443)
    assert not reaches(policies, pod, Pod({"app": "x"}, "default"), 443)
    # The run pods that call the API server get the same addresses from the operator.
    env = environ(objs)
    assert env["SCALERL_API_SERVER_CIDRS"] == "10.96.0.1/32,172.18.0.2/32"
    assert env["SCALERL_API_SERVER_PORTS"] == "443,6443"
    assert env["SCALERL_DNS_NAMESPACES"] == "kube-system"


def test_unknown_api_server_addresses_leave_its_ports_open_to_any_address() -> None:
    # `helm template` cannot look the cluster up; neither values nor look-up name an address.
    objs = render()
    policies, pod = of_kind(objs, "NetworkPolicy"), operator_pod(objs)
    assert reaches(policies, pod, INTERNET, 443) and reaches(policies, pod, INTERNET, 6443)
    assert reaches(policies, pod, "2001:db8::1", 6443)
    assert not reaches(policies, pod, INTERNET, 80)
    assert environ(objs)["SCALERL_API_SERVER_CIDRS"] == "0.0.0.0/0,::/0"


def test_dns_servers_elsewhere() -> None:
    objs = render({"networkPolicy": {"dnsNamespaces": ["openshift-dns"]}})
    policies, pod = of_kind(objs, "NetworkPolicy"), operator_pod(objs)
    assert reaches(policies, pod, Pod({"dns.operator.openshift.io/daemonset-dns": "default"},
                                      "openshift-dns"), 53, "UDP")  # fmt: skip
    assert not reaches(policies, pod, DNS_SERVER, 53, "UDP")
    assert environ(objs)["SCALERL_DNS_NAMESPACES"] == "openshift-dns"
    anywhere = render({"networkPolicy": {"dnsNamespaces": []}})
    assert reaches(of_kind(anywhere, "NetworkPolicy"), operator_pod(anywhere), "169.254.20.10", 53)


def test_policies_off_render_none_and_tell_the_operator() -> None:
    objs = render({"networkPolicy": {"enabled": False}})
    assert of_kind(objs, "NetworkPolicy") == []
    assert environ(objs)["SCALERL_NETWORK_POLICY"] == "false"


def test_the_operator_is_ready_when_kopf_answers_and_has_a_cpu_limit() -> None:
    objs = render()
    found = container(objs)
    liveness_port = next(p for p in found["ports"] if p["name"] == "liveness")
    probe = found["readinessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in found["args"]
    assert liveness_port["containerPort"] == 8080
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 3)
    assert found["resources"]["limits"]["cpu"] == "1"
    tuned = container(render({"operator": {"readinessProbe": {"periodSeconds": 30}}}))
    assert tuned["readinessProbe"]["periodSeconds"] == 30


@pytest.mark.parametrize("tag", ["", "0.2.0"])
def test_a_digest_wins_over_the_tag_for_the_operator_and_its_jobs(tag: str) -> None:
    objs = render({"image": {"digest": DIGEST, "tag": tag}})
    assert container(objs)["image"] == f"scalerl/operator@{DIGEST}"
    assert environ(objs)["SCALERL_FIT_IMAGE"] == f"scalerl/operator@{DIGEST}"
    by_tag = render({"image": {"tag": tag}})
    assert container(by_tag)["image"] == f"scalerl/operator:{tag or '0.1.0'}"


def test_run_images_by_digest_reach_the_operator() -> None:
    trainer = f"registry.example.com/scalerl/trainer@{DIGEST}"
    generator = f"registry.example.com/scalerl/generator:0.1.0@{DIGEST}"
    env = environ(render({"runImages": {"trainer": trainer, "generator": generator}}))
    assert (env["SCALERL_TRAINER_IMAGE"], env["SCALERL_GENERATOR_IMAGE"]) == (trainer, generator)
