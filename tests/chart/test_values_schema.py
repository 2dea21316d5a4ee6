"""values.schema.json: Helm refuses values the chart cannot use, and names the bad key.

Helm checks the merged values (values.yaml under the user's) against the chart's schema before it
renders anything; the real Helm engine does it here, as `helm install` would:

    render_files({"alerts": {"truncation": {"treshold": 0.2}}})
    # helm_python.HelmValuesError: values don't meet the specifications of the schema(s) ...
    # - at '/alerts/truncation': additional properties 'treshold' not allowed

    refusal({"operator": {"metricsPort": 70000}})   # that message, as a string

The last tests walk values.yaml and the schema together, so that a key added to one and not the
other (or added without a description) fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from helmchart import CHART, of_kind, one, render, render_files
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

Obj = dict[str, Any]
KeyPath = tuple[str, ...]  # a value's keys from the top, e.g. ("alerts", "truncation", "for")

SCHEMA: Obj = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: Obj = yaml.safe_load((CHART / "values.yaml").read_text())

# Kubernetes objects passed through as they are (toYaml), and Helm's `global`: the schema gives
# their type only, so any field Kubernetes knows is accepted. Every other object is the chart's own
# and closed.
FREE_FORM: set[KeyPath] = {
    ("global",),
    ("operator", "resources"),
    ("operator", "nodeSelector"),
    ("operator", "tolerations"),
    ("operator", "affinity"),
    ("operator", "podAnnotations"),
    ("imagePullSecrets",),
}

# Helm's own: a parent chart passes `global` to its subcharts; values.yaml does not set it.
NOT_IN_VALUES: set[KeyPath] = {("global",)}

# Prometheus's duration units, in the only order model.ParseDuration accepts them.
UNITS = ("y", "w", "d", "h", "m", "s", "ms")
_DURATION_PART = re.compile(r"([0-9]+)(ms|y|w|d|h|m|s)")

WINDOWS: list[KeyPath] = [
    ("alerts", "truncation", "window"),
    ("alerts", "noProgress", "window"),
    ("alerts", "noLearningSignal", "window"),
    ("alerts", "skippedSteps", "window"),
    ("alerts", "weightSync", "window"),
    ("alerts", "staleGroups", "window"),
    ("alerts", "prediction", "window"),
    ("alerts", "restarts", "window"),
    ("monitoring", "podMonitor", "interval"),
    ("monitoring", "serviceMonitor", "interval"),
]
HOLDS: list[KeyPath] = [
    ("alerts", "truncation", "for"),
    ("alerts", "noProgress", "for"),
    ("alerts", "noLearningSignal", "for"),
    ("alerts", "skippedSteps", "for"),
    ("alerts", "weightSync", "for"),
    ("alerts", "staleGroups", "for"),
    ("alerts", "prediction", "for"),
    ("alerts", "restarts", "for"),
]
PORTS: list[KeyPath] = [("operator", "metricsPort"), ("operator", "livenessPort")]
COUNTS: list[KeyPath] = [
    ("alerts", "noLearningSignal", "steps"),
    ("alerts", "skippedSteps", "steps"),
    ("alerts", "weightSync", "failures"),
    ("alerts", "restarts", "count"),
]


def examples(count: int) -> settings:
    """`count` examples; no deadline (a shared 2-core machine), no example database in the tree."""
    return settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


# --- helpers --------------------------------------------------------------------------------


def nested(path: KeyPath, value: Any) -> Obj:
    """The values that set only `path` to `value`: ("a", "b"), 1 -> {"a": {"b": 1}}."""
    values: Any = value
    for key in reversed(path):
        values = {key: values}
    return values


def pointer(path: KeyPath) -> str:
    """How Helm's error names a value: a JSON pointer, "/alerts/truncation/for"."""
    return "".join(f"/{key}" for key in path)


def refusal(values: Obj) -> str:
    """Helm's message for values the schema refuses; fails the test if Helm renders them."""
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render_files(values)
    message = str(caught.value)
    # The schema refused them, not a template that choked on them later.
    assert "values don't meet the specifications of the schema" in message, message
    return message


def assert_refused_at(values: Obj, path: KeyPath) -> None:
    message = refusal(values)
    # The value itself, or inside it (a list's item: /operator/watchNamespaces/0).
    assert f"at '{pointer(path)}'" in message or f"at '{pointer(path)}/" in message, message


def parsed(files: dict[str, str], template: str) -> Obj:
    """One template's manifest, parsed (the dashboards are big: parse only what a test reads)."""
    return yaml.safe_load(files[f"scalerl/templates/{template}"])


def rules_by_alert(rule: Obj) -> dict[str, Obj]:
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def is_duration_with_units(text: str) -> bool:
    """Whether Prometheus parses `text` as a duration and each number has its unit (units in
    order, each once). Written apart from the schema's pattern, to check that pattern."""
    position, last = 0, -1
    while position < len(text):
        part = _DURATION_PART.match(text, position)
        if part is None or UNITS.index(part[2]) <= last:
            return False
        last, position = UNITS.index(part[2]), part.end()
    return position > 0


# --- strategies -----------------------------------------------------------------------------


@st.composite
def durations(draw: st.DrawFn, *, positive: bool) -> str:
    """A Prometheus duration of one to three units in order (5m, 1h30m, 0m); above zero when
    `positive` (a range selector or scrape interval of 0 means nothing)."""
    units = sorted(
        draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=3, unique=True)),
        key=UNITS.index,
    )
    counts = [draw(st.integers(0, 999)) for _ in units]
    if positive and not any(counts):
        counts[-1] = draw(st.integers(1, 999))
    return "".join(f"{count}{unit}" for count, unit in zip(counts, units, strict=True))


def zero_durations() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(UNITS), min_size=1, max_size=3, unique=True).map(
        lambda units: "".join(f"0{unit}" for unit in sorted(units, key=UNITS.index))
    )


def not_durations() -> st.SearchStrategy[Any]:
    """What users write instead of a duration: bare numbers (YAML ints once rendered), spelt-out
    units, units out of order or twice, and near-miss text."""
    near_miss = st.text(alphabet="0123456789ywdhmsMHin .-:", max_size=8)
    return st.one_of(
        st.integers(0, 10_000),
        st.integers(0, 10_000).map(str),
        near_miss.filter(lambda text: not is_duration_with_units(text)),
        st.text(max_size=8).filter(lambda text: not is_duration_with_units(text)),
    )


def invalid_values() -> st.SearchStrategy[tuple[KeyPath, Any]]:
    """A value the chart cannot use, and where it goes."""
    finite = {"allow_nan": False, "allow_infinity": False}
    by_path: list[tuple[KeyPath, st.SearchStrategy[Any]]] = [
        (
            ("alerts", "truncation", "threshold"),
            st.one_of(
                st.floats(max_value=0, **finite),
                st.floats(min_value=1, exclude_min=True, **finite),
                st.text(max_size=5),
                st.booleans(),
            ),
        ),
        (
            ("alerts", "staleGroups", "share"),
            st.one_of(
                st.floats(max_value=0, **finite),
                st.floats(min_value=1, **finite),
                st.text(max_size=5),
            ),
        ),
        (
            ("alerts", "prediction", "drop"),
            st.one_of(
                st.floats(max_value=0, exclude_max=True, **finite), st.floats(min_value=1, **finite)
            ),
        ),
        *((path, not_durations()) for path in HOLDS),
        *((path, st.one_of(not_durations(), zero_durations())) for path in WINDOWS),
        *(
            (path, st.one_of(st.integers(-(10**6), 0), st.integers(65_536, 10**9), st.just("9090")))
            for path in PORTS
        ),
        *(
            (
                path,
                st.one_of(
                    st.integers(-100, 0),
                    st.floats(0.01, 100, **finite).filter(lambda x: not x.is_integer()),
                ),
            )
            for path in COUNTS
        ),
    ]
    return st.sampled_from(by_path).flatmap(
        lambda case: case[1].map(lambda value: (case[0], value))
    )


# --- the defaults ---------------------------------------------------------------------------


def test_schema_is_draft_07() -> None:
    # The draft Helm reads: it picks the rules it applies from `$schema`. A second implementation
    # (Python's) agrees that the schema is well-formed and that values.yaml meets it.
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(DEFAULTS)


def test_default_values_render() -> None:
    # values.yaml itself meets the schema: a plain `helm install` works.
    objs = render()
    for kind in ("Deployment", "PrometheusRule", "PodMonitor", "ServiceMonitor", "ServiceAccount"):
        assert of_kind(objs, kind), kind


@pytest.mark.parametrize(
    "values",
    [
        # Kubernetes fields pass through the free-form objects untouched.
        {
            "operator": {
                "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]},
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {}},
                "podAnnotations": {"example.com/team": "rl"},
            },
            "imagePullSecrets": [{"name": "regcred"}],
        },
        # The edges of the ranges, and the zero hold.
        {"alerts": {"truncation": {"threshold": 1, "for": "0m"}, "prediction": {"drop": 0}}},
        {"operator": {"metricsPort": 1, "livenessPort": 65535}},
        # An existing ServiceAccount, by name.
        {"serviceAccount": {"create": False, "name": "scalerl-operator"}},
        # A private registry with a port, and pinned run images.
        {
            "image": {
                "repository": "registry.example.com:5000/ml/scalerl-operator",
                "tag": "0.2.0",
            },
            "runImages": {"trainer": "localhost:5000/trainer@sha256:" + "0" * 64},
        },
        {
            "operator": {"watchNamespaces": ["team-a", "team-b"]},
            "networkPolicy": {"metricsNamespaces": []},
        },
        {
            "grafana": {
                "alertRule": {"interval": "1m30s"},
                "dashboards": {"label": "example.com/dash"},
            }
        },
        # As a subchart, the parent's globals come along.
        {"global": {"imageRegistry": "registry.example.com"}},
    ],
)
def test_valid_values_render(values: Obj) -> None:
    assert render_files(values)


def test_render_reflects_free_form_objects() -> None:
    # The Kubernetes objects reach the pod as written (the schema does not reshape them).
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]
    files = render_files({"operator": {"tolerations": tolerations}})
    pod = parsed(files, "deployment.yaml")["spec"]["template"]["spec"]
    assert pod["tolerations"] == tolerations


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where", "key"),
    [
        ({"imagePullSecret": [{"name": "regcred"}]}, "", "imagePullSecret"),
        ({"alert": {"severity": "critical"}}, "", "alert"),
        ({"alerts": {"truncation": {"treshold": 0.2}}}, "/alerts/truncation", "treshold"),
        ({"operator": {"metricPort": 9191}}, "/operator", "metricPort"),
        (
            {"grafana": {"alertRule": {"datasourceUID": "prom"}}},
            "/grafana/alertRule",
            "datasourceUID",
        ),
        (
            {"monitoring": {"podMonitor": {"intervall": "1m"}}},
            "/monitoring/podMonitor",
            "intervall",
        ),
    ],
)
def test_misspelt_key_is_refused(values: Obj, where: str, key: str) -> None:
    # Without the schema Helm would ignore the key and keep the default: the user's threshold
    # would silently not apply.
    message = refusal(values)
    assert f"at '{where}'" in message, message
    assert f"'{key}'" in message, message


@pytest.mark.parametrize(
    ("path", "value"),
    [
        # Types: a quoted boolean would reach the operator as SCALERL_NETWORK_POLICY=yes.
        (("networkPolicy", "enabled"), "yes"),
        (("operator", "verbose"), "false"),  # a non-empty string is true to the template
        (("image", "tag"), 1.1),  # what --set image.tag=1.10 gives
        (("grafana", "dashboards", "labelValue"), 1),
        (("operator", "watchNamespaces"), "team-a"),
        # Ranges.
        (("operator", "metricsPort"), 70000),
        (("operator", "livenessPort"), 0),
        (("alerts", "truncation", "threshold"), 1.5),
        (("alerts", "truncation", "threshold"), 0),
        (("alerts", "prediction", "drop"), -0.1),
        (("alerts", "weightSync", "maxSeconds"), 0),
        (("alerts", "restarts", "count"), 0),
        (("alerts", "noLearningSignal", "steps"), 2.5),
        # Durations.
        (("alerts", "truncation", "for"), "ten minutes"),
        (("alerts", "truncation", "for"), "0"),  # unquoted in the rule, a bare 0 is a number
        (("alerts", "truncation", "window"), "0m"),  # an empty range selects nothing
        (("alerts", "noProgress", "window"), "5m1h"),  # units out of order
        (("monitoring", "serviceMonitor", "interval"), "30sec"),
        (("grafana", "alertRule", "interval"), "15s"),  # Grafana's tick is 10 s
        # Enums and names.
        (("image", "pullPolicy"), "Sometimes"),
        (("image", "repository"), "scalerl/operator:0.1.0"),  # the tag has its own key
        (("runImages", "trainer"), ""),
        (("operator", "watchNamespaces"), ["Team_A"]),
        (("networkPolicy", "metricsNamespaces"), ["monitoring", "monitoring"]),
        (("serviceAccount", "name"), "Operator"),
        (("monitoring", "release"), ""),
        (("grafana", "alertRule", "label"), "grafana alert"),
        (("alerts", "severity"), "warning: high"),
        # Digests, probes and the policies' peers.
        (("image", "digest"), "sha256:abc"),  # too short
        (("image", "digest"), "a" * 64),  # no algorithm
        (("image", "digest"), "sha256:" + "A" * 64),  # upper-case hex
        (("operator", "readinessProbe", "periodSeconds"), 0),
        (("operator", "readinessProbe", "failureThreshold"), "3"),
        (("networkPolicy", "dnsNamespaces"), ["Kube-System"]),
        (("networkPolicy", "apiServer", "cidrs"), ["10.96.0.1"]),  # no prefix length
        (("networkPolicy", "apiServer", "cidrs"), ["kubernetes.default"]),  # a host: no CIDR
        (("networkPolicy", "apiServer", "ports"), [0]),
    ],
)
def test_wrong_value_is_refused(path: KeyPath, value: Any) -> None:
    assert_refused_at(nested(path, value), path)


def test_null_default_is_refused() -> None:
    # A null deletes a default in Helm; without the value the rule would read `> ` and nothing.
    assert_refused_at(nested(("alerts", "truncation", "threshold"), None), ("alerts", "truncation"))
    assert "threshold" in refusal(nested(("alerts", "truncation", "threshold"), None))


def test_existing_service_account_needs_a_name() -> None:
    # With create: false the chart binds its ClusterRole to `name`: empty, it would bind nothing.
    assert_refused_at({"serviceAccount": {"create": False}}, ("serviceAccount", "name"))
    objs = render({"serviceAccount": {"create": False, "name": "ops"}})
    assert not of_kind(objs, "ServiceAccount")
    assert one(objs, "ClusterRoleBinding")["subjects"][0]["name"] == "ops"


# --- properties -----------------------------------------------------------------------------


@examples(30)
@given(
    threshold=st.floats(min_value=0, max_value=1, exclude_min=True) | st.just(1),
    window=durations(positive=True),
    hold=durations(positive=False),
    stall=durations(positive=True),
    restarts=st.integers(1, 10**6),
    metrics_port=st.integers(1, 65535),
    liveness_port=st.integers(1, 65535),
)
def test_valid_values_reach_the_manifests(
    threshold: float,
    window: str,
    hold: str,
    stall: str,
    restarts: int,
    metrics_port: int,
    liveness_port: int,
) -> None:
    assume(metrics_port != liveness_port)  # one port cannot serve both (a test below)
    files = render_files(
        {
            "alerts": {
                "truncation": {"threshold": threshold, "window": window, "for": hold},
                "noProgress": {"window": stall},
                "restarts": {"count": restarts},
            },
            "operator": {"metricsPort": metrics_port, "livenessPort": liveness_port},
        }
    )
    rules = rules_by_alert(parsed(files, "prometheusrule.yaml"))

    truncation = rules["ScaleRLTruncationRateHigh"]
    assert f"[{window}]" in truncation["expr"]
    # Helm prints a float in its shortest exact form: the rule compares with the same number.
    compared = re.search(r">\s*(\S+)\s*$", truncation["expr"])
    assert compared is not None and float(compared[1]) == threshold
    assert truncation["for"] == hold
    assert f"offset {stall}" in rules["ScaleRLNoTrainingProgress"]["expr"]
    # From a million on Helm prints numbers as 1e+06, which PromQL reads as the same number.
    counted = re.search(r">=\s*(\S+)\s*$", rules["ScaleRLGangRestarted"]["expr"])
    assert counted is not None and float(counted[1]) == restarts

    # The Grafana copy of the truncation alert follows the same values.
    (grafana,) = yaml.safe_load(
        parsed(files, "grafana-alert-rule.yaml")["data"]["scalerl-alerts.yaml"]
    )["groups"][0]["rules"]
    assert grafana["for"] == hold
    (evaluator,) = [d for d in grafana["data"] if d["refId"] == "C"]
    assert float(evaluator["model"]["conditions"][0]["evaluator"]["params"][0]) == threshold

    container = parsed(files, "deployment.yaml")["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": metrics_port, "liveness": liveness_port}
    assert f"--metrics-port={metrics_port}" in container["args"]
    assert f"--liveness=http://0.0.0.0:{liveness_port}/healthz" in container["args"]
    assert parsed(files, "service.yaml")["spec"]["ports"][0]["port"] == metrics_port


@examples(30)
@given(case=invalid_values())
def test_invalid_values_are_refused(case: tuple[KeyPath, Any]) -> None:
    path, value = case
    assert_refused_at(nested(path, value), path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", True),
        ("1h30m", True),
        ("0m", True),
        ("5ms", True),
        ("1y2w3d4h5m6s7ms", True),
        ("0", False),  # Prometheus takes it, but unquoted in a rule it is the number 0
        ("5m1h", False),
        ("5m5m", False),
        ("1.5h", False),
        ("10 m", False),
        ("5min", False),
        ("", False),
    ],
)
def test_duration_oracle(text: str, expected: bool) -> None:
    # The property tests trust this function to tell a duration from garbage.
    assert is_duration_with_units(text) is expected


# --- the schema keeps up with values.yaml ---------------------------------------------------


def schema_properties(node: Obj, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Obj]]:
    """Every property the schema declares, nested ones included, with its schema."""
    for key, sub in node.get("properties", {}).items():
        yield path + (key,), sub
        yield from schema_properties(sub, path + (key,))


def value_keys(values: Obj, path: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key of values.yaml, down to the free-form Kubernetes objects (their insides are
    Kubernetes's)."""
    for key, value in values.items():
        yield path + (key,)
        if isinstance(value, dict) and path + (key,) not in FREE_FORM:
            yield from value_keys(value, path + (key,))


def test_every_value_is_in_the_schema() -> None:
    declared = {path for path, _ in schema_properties(SCHEMA)}
    missing = [".".join(path) for path in value_keys(DEFAULTS) if path not in declared]
    assert not missing, f"values.yaml keys without a schema: {missing}"


def test_schema_declares_no_removed_value() -> None:
    present = set(value_keys(DEFAULTS))
    stale = [
        ".".join(path)
        for path, _ in schema_properties(SCHEMA)
        if path not in present and path not in NOT_IN_VALUES
    ]
    assert not stale, f"schema properties no longer in values.yaml: {stale}"


def test_every_property_is_described() -> None:
    undescribed = [
        ".".join(path)
        for path, sub in schema_properties(SCHEMA)
        if not str(sub.get("description", "")).strip()
    ]
    assert not undescribed, f"schema properties without a description: {undescribed}"


def test_only_kubernetes_objects_are_open() -> None:
    # additionalProperties: false on every object of the chart's own, so that a misspelt key
    # fails; the free-form ones are exactly the Kubernetes objects passed through.
    assert SCHEMA["additionalProperties"] is False
    open_objects = set()
    for path, sub in schema_properties(SCHEMA):
        if "properties" in sub:
            assert sub.get("additionalProperties") is False, ".".join(path)
        elif is_open(sub):
            open_objects.add(path)
    assert open_objects == FREE_FORM


def is_open(node: Obj) -> bool:
    """An object whose keys the schema leaves free, or a list of such objects."""
    if node.get("type") == "object":
        return "properties" not in node
    if node.get("type") == "array":
        items = node.get("items", {})
        return items.get("type") == "object" and items.get("additionalProperties") is not False
    return False


def test_the_metrics_and_liveness_ports_must_differ() -> None:
    # Draft-07 cannot compare two fields: the template refuses it, naming both.
    with pytest.raises(helm_python.HelmError, match="metricsPort and operator.livenessPort"):
        render({"operator": {"metricsPort": 8080, "livenessPort": 8080}})
