"""JSON schemas of the Prometheus Operator kinds the chart renders (monitoring.coreos.com/v1).

kubernetes-validate knows only built-in kinds. These schemas keep the parts of the Prometheus
Operator CRDs (monitoring.coreos.com_{podmonitors,servicemonitors,prometheusrules}.yaml of
prometheus-operator) that an object of this chart can get wrong: the required fields, the types,
the duration pattern, and the rule shape (`alert` or `record`, with `expr`); stricter than the
CRDs, a monitor needs an endpoint and a rule group a rule (without, they would do nothing). Each
object lists the fields of its CRD that the chart may use and rejects others, so that a misspelt
field fails here instead of being pruned silently by the API server: add a field here (from the
CRD) when a template starts using it.

    from schemas import validate
    validate(obj)  # raises jsonschema.ValidationError
"""

from __future__ import annotations

from typing import Any

import jsonschema

API_VERSION = "monitoring.coreos.com/v1"

# Prometheus durations as the CRDs write their pattern: 0, or units from years to milliseconds.
DURATION = {
    "type": "string",
    "pattern": (
        r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
        r"(([0-9]+)ms)?)$"
    ),
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
STRINGS = {"type": "array", "items": {"type": "string"}}
DNS_SUBDOMAIN = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}

METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": DNS_SUBDOMAIN,
        "namespace": DNS_SUBDOMAIN,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": STRINGS,
                },
            },
        },
    },
}

NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": STRINGS},
}

RELABELINGS = {"type": "array", "items": {"type": "object"}}

# What a PodMonitor's podMetricsEndpoints[] and a ServiceMonitor's endpoints[] share.
_ENDPOINT_FIELDS: dict[str, Any] = {
    "port": {"type": "string", "minLength": 1},
    "path": {"type": "string"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "params": {"type": "object", "additionalProperties": STRINGS},
    "relabelings": RELABELINGS,
    "metricRelabelings": RELABELINGS,
    "tlsConfig": {"type": "object"},
    "authorization": {"type": "object"},
    "followRedirects": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"},
}


def _kind(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
    }


POD_MONITOR = _kind(
    "PodMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "jobLabel": {"type": "string"},
            "podTargetLabels": STRINGS,
            "sampleLimit": {"type": "integer", "minimum": 0},
            "targetLimit": {"type": "integer", "minimum": 0},
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "anyOf": [{"required": ["port"]}, {"required": ["portNumber"]}],
                    "properties": {
                        **_ENDPOINT_FIELDS,
                        "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
                        "filterRunning": {"type": "boolean"},
                    },
                },
            },
        },
    },
)

SERVICE_MONITOR = _kind(
    "ServiceMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "jobLabel": {"type": "string"},
            "targetLabels": STRINGS,
            "podTargetLabels": STRINGS,
            "sampleLimit": {"type": "integer", "minimum": 0},
            "targetLimit": {"type": "integer", "minimum": 0},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
                    "properties": {
                        **_ENDPOINT_FIELDS,
                        "targetPort": {"type": ["integer", "string"]},
                    },
                },
            },
        },
    },
)

_RULE_FIELDS: dict[str, Any] = {
    "expr": {"type": ["string", "integer"], "minLength": 1},
    "labels": STRING_MAP,
}
ALERTING_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["alert", "expr"],
    "properties": {
        **_RULE_FIELDS,
        "alert": {"type": "string", "minLength": 1},  # any label value
        "for": DURATION,
        "keep_firing_for": DURATION,
        "annotations": STRING_MAP,
    },
}
RECORDING_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["record", "expr"],
    "properties": {
        **_RULE_FIELDS,
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
    },
}

PROMETHEUS_RULE = _kind(
    "PrometheusRule",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": DURATION,
                        "limit": {"type": "integer", "minimum": 0},
                        "query_offset": DURATION,
                        "labels": STRING_MAP,
                        "rules": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"oneOf": [ALERTING_RULE, RECORDING_RULE]},
                        },
                    },
                },
            }
        },
    },
)

SCHEMAS = {
    "PodMonitor": POD_MONITOR,
    "ServiceMonitor": SERVICE_MONITOR,
    "PrometheusRule": PROMETHEUS_RULE,
}


def validate(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless `obj` is a valid object of its kind; a rule
    group's name is unique within its PrometheusRule (the CRD's list-map key)."""
    schema = SCHEMAS[obj["kind"]]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(obj, schema, cls=jsonschema.Draft202012Validator)
    if obj["kind"] == "PrometheusRule":
        names = [group["name"] for group in obj["spec"]["groups"]]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise jsonschema.ValidationError(f"rule groups named more than once: {duplicates}")
