"""Every object the chart renders is one the API server accepts: `helm lint --strict`, Kubernetes'
own schemas (kubernetes-validate) for the built-in kinds and the CRD, the Prometheus Operator's
for the monitors and rules (schemas.py), for the default values and for non-default ones. Then the
operator's Deployment: one restricted, probed replica whose arguments the CLI accepts.

(Named apart from tests/operator/test_manifests.py: the test folders are not packages, so two test
modules may not share a name.)
"""

from __future__ import annotations

from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from helmchart import CHART, KUBE_VERSION, crds, of_kind, one, render, render_files
from schemas import API_VERSION as MONITORING
from schemas import SCHEMAS
from schemas import validate as validate_monitoring

from scalerl.cli import build_parser
from scalerl.operator.handlers import images_from_environ

DEFAULTS: dict[str, Any] = {}
# Every switch away from its default, with the monitors on (their non-default shapes)...
CUSTOM: dict[str, Any] = {
    "image": {"tag": "0.1.1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccount": {"create": False, "name": "scalerl-existing"},
    "operator": {
        "watchNamespaces": ["team-a", "team-b"],
        "verbose": True,
        "metricsPort": 9191,
        "livenessPort": 8181,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops"}],
        "podAnnotations": {"example.com/team": "ml"},
    },
    "networkPolicy": {"metricsNamespaces": ["monitoring", "observability"]},
    "monitoring": {"release": "prom-stack"},
    "podSecurity": {"runAsUser": None},  # OpenShift: the platform assigns the IDs
}
# ...and everything optional off.
MINIMAL: dict[str, Any] = {
    "networkPolicy": {"enabled": False},
    "monitoring": {
        "podMonitor": {"enabled": False},
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
    },
    "grafana": {"dashboards": {"enabled": False}, "alertRule": {"enabled": False}},
}
VALUES = {"defaults": DEFAULTS, "custom": CUSTOM, "minimal": MINIMAL}

# What a chart without an icon in Chart.yaml is told, also under --strict: no defect.
LINT_ACCEPTED = {"icon is recommended"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in VALUES.items()}


def _described(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"


# --- helm lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUES)
def test_helm_lint_strict_finds_nothing(name: str) -> None:
    report = helm_python.lint(
        str(CHART), VALUES[name], strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    assert report["errors"] == []
    findings = [m for m in report["messages"] if m["error"] not in LINT_ACCEPTED]
    assert findings == [], yaml.safe_dump(findings)


# --- Kubernetes' schemas ------------------------------------------------------------------------


def _is_monitoring(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0] == MONITORING.split("/")[0]


def validate_builtin(obj: dict[str, Any]) -> None:
    """kubernetes-validate, strict (no unknown fields), with every error's path in the failure."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = ".".join(str(p) for p in err.path)
        pytest.fail(f"{_described(obj)}: {where}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(
            f"{_described(obj)}: not a built-in kind of Kubernetes {KUBE_VERSION}: {err.message}"
        )


@pytest.mark.parametrize("name", VALUES)
def test_every_built_in_object_passes_kubernetes_schemas(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objs = [obj for obj in rendered[name] if not _is_monitoring(obj)]
    kinds = {obj["kind"] for obj in objs}
    assert {"Deployment", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds
    assert ("ServiceAccount" in kinds) == (name != "custom")  # custom brings its own
    for obj in objs:
        validate_builtin(obj)


def test_the_crds_pass_kubernetes_schemas() -> None:
    found = crds()
    assert sorted(crd["metadata"]["name"] for crd in found) == [
        "scalerlruns.scalerl.dev",
        "scalerlsweeps.scalerl.dev",
    ]
    for crd in found:
        assert crd["kind"] == "CustomResourceDefinition"
        validate_builtin(crd)


# --- the Prometheus Operator's schemas ----------------------------------------------------------


@pytest.mark.parametrize("name", VALUES)
def test_monitors_and_rules_pass_the_prometheus_operator_schemas(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Whatever monitoring.coreos.com objects are rendered (PrometheusRule once its template
    exists), each of a known kind and valid."""
    objs = [obj for obj in rendered[name] if _is_monitoring(obj)]
    kinds = sorted(obj["kind"] for obj in objs)
    if name == "minimal":
        assert kinds == []
    else:
        assert {"PodMonitor", "ServiceMonitor"} <= set(kinds)
    for obj in objs:
        assert obj["kind"] in SCHEMAS, f"{_described(obj)}: no schema in schemas.py"
        assert obj["apiVersion"] == MONITORING, _described(obj)
        try:
            validate_monitoring(obj)
        except jsonschema.ValidationError as err:
            where = ".".join(str(p) for p in err.absolute_path)
            pytest.fail(f"{_described(obj)}: {where}: {err.message}")


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "PodMonitor", "spec": {"podMetricsEndpoints": [{"port": "metrics"}]}},
        {"kind": "PodMonitor", "spec": {"selector": {}, "podMetricEndpoints": [{"port": "m"}]}},
        {"kind": "ServiceMonitor", "spec": {"selector": {}, "endpoints": [{"interval": "30 s"}]}},
        {"kind": "PrometheusRule", "spec": {"groups": [{"rules": [{"alert": "A", "expr": "1"}]}]}},
        {"kind": "PrometheusRule", "spec": {"groups": [{"name": "g", "rules": [{"expr": "1"}]}]}},
        {
            "kind": "PrometheusRule",
            "spec": {
                "groups": [{"name": "g", "rules": [{"alert": "A", "record": "r", "expr": "1"}]}]
            },
        },
        {
            "kind": "PrometheusRule",
            "spec": {
                "groups": [
                    {"name": "g", "rules": [{"alert": "A", "expr": "1", "labels": {"n": 1}}]}
                ]
            },
        },
    ],
    ids=[
        "podmonitor-without-selector",
        "podmonitor-misspelt-endpoints",
        "servicemonitor-bad-interval-no-port",
        "rule-group-without-name",
        "rule-neither-alert-nor-record",
        "rule-both-alert-and-record",
        "rule-label-not-a-string",
    ],
)
def test_the_prometheus_operator_schemas_reject_what_their_crds_reject(obj: dict[str, Any]) -> None:
    full = {"apiVersion": MONITORING, "metadata": {"name": "x", "namespace": "ns"}, **obj}
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring(full)


def test_the_monitors_carry_the_release_label_kube_prometheus_stack_selects(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, release in (("defaults", "kube-prometheus-stack"), ("custom", "prom-stack")):
        monitoring = [obj for obj in rendered[name] if _is_monitoring(obj)]
        assert monitoring
        for obj in monitoring:
            assert obj["metadata"]["labels"]["release"] == release, _described(obj)


def test_default_values_render_no_monitor_where_the_cluster_has_no_prometheus_operator() -> None:
    """`helm install` with default values on a cluster without monitoring.coreos.com/v1: the
    monitors' `enabled: auto` leaves them out (a kind the server does not serve fails the install),
    and `true` still renders them."""
    objs = render(prometheus_operator=False)
    assert [o["kind"] for o in objs if _is_monitoring(o)] == []
    forced = {"monitoring": {"prometheusRule": {"enabled": True}}}
    kinds = [o["kind"] for o in render(forced, prometheus_operator=False) if _is_monitoring(o)]
    assert kinds == ["PrometheusRule"]


def notes(values: dict[str, Any] | None = None, **kwargs: Any) -> str:
    """What `helm install` prints after installing (NOTES.txt, by the real Helm engine)."""
    files = render_files(values, **kwargs)
    (path,) = [path for path in files if path.endswith("NOTES.txt")]
    return files[path]


def test_the_notes_promise_alerts_only_where_the_rule_is_rendered() -> None:
    # `enabled: auto` (the default) on a cluster without monitoring.coreos.com/v1: no rule, so
    # no word of one.
    assert "PrometheusRule" not in notes(prometheus_operator=False)
    assert "Alerts:" in notes()  # the Prometheus Operator is there
    off = {"monitoring": {"prometheusRule": {"enabled": False}}}
    assert "Alerts:" not in notes(off)
    forced = {"monitoring": {"prometheusRule": {"enabled": True}}}
    assert "Alerts: PrometheusRule scalerl " in notes(forced, prometheus_operator=False)


# --- the operator's Deployment ------------------------------------------------------------------


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("name", VALUES)
def test_the_operator_runs_once_restricted_and_probed(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    deployment = one(rendered[name], "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1  # kopf standalone: two would act twice
    assert spec["strategy"] == {"type": "Recreate"}  # never two, even while rolling out

    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"].get("runAsUser") != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(deployment)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    assert not security.get("privileged", False)

    # kopf's liveness endpoint, served where the probe looks
    (liveness,) = [a for a in container["args"] if a.startswith("--liveness=")]
    url = liveness.removeprefix("--liveness=")
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = ports[probe["port"]] if isinstance(probe["port"], str) else probe["port"]
    assert url == f"http://0.0.0.0:{port}{probe['path']}"


@pytest.mark.parametrize(("name", "user"), [("defaults", 10001), ("custom", None)])
def test_the_operator_and_its_runs_pods_share_the_user_ids_of_the_values(
    name: str, user: int | None, rendered: dict[str, list[dict[str, Any]]], monkeypatch: Any
) -> None:
    deployment = one(rendered[name], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"].get("runAsUser") == pod["securityContext"].get("runAsGroup")
    assert pod["securityContext"].get("runAsUser") == user
    env = {e["name"]: e["value"] for e in _container(deployment)["env"]}
    monkeypatch.setenv("SCALERL_RUN_AS_USER", env["SCALERL_RUN_AS_USER"])
    assert images_from_environ().run_as == user  # what the operator gives the runs' pods


@pytest.mark.parametrize("name", VALUES)
def test_the_operator_command_is_one_the_cli_accepts(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    container = _container(one(rendered[name], "Deployment"))
    program, *command = container["command"]
    assert program == "scalerl"
    argv = [*command, *container["args"]]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # argparse printed why
        pytest.fail(f"`scalerl {' '.join(argv)}` is not a command the CLI accepts")
    assert args.command == "operator"
    operator = VALUES[name].get("operator", {})
    assert args.namespace == operator.get("watchNamespaces", [])
    assert args.metrics_port == operator.get("metricsPort", 9090)
    assert args.verbose is operator.get("verbose", False)


def test_the_operator_service_account_is_the_bound_one(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name in VALUES:
        objs = rendered[name]
        account = one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        (binding,) = of_kind(objs, "ClusterRoleBinding")
        assert [s["name"] for s in binding["subjects"]] == [account]
        created = [sa["metadata"]["name"] for sa in of_kind(objs, "ServiceAccount")]
        assert created == ([] if name == "custom" else [account])
