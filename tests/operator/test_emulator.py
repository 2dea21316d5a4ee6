"""The API emulator behaves as kubectl and kopf expect an API server to (see emulator.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from typing import Any

import pytest
import yaml
from emulator_query import field_selector, jsonpath, label_selector
from emulator_tables import human_age

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.dev"},
    "spec": {
        "group": "example.dev",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
            "categories": ["toys"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {
                        "name": "Ready",
                        "type": "string",
                        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                    },
                ],
            }
        ],
    },
}


def widget(name: str = "w1", size: int = 3, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "example.dev/v1",
        "kind": "Widget",
        "metadata": meta,
        "spec": {"size": size},
    }


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


@pytest.fixture
def widgets(k8s: Any) -> Any:
    k8s.install_crd(WIDGET_CRD)
    return k8s


def test_kubectl_apply_creates_objects_with_server_assigned_metadata(widgets: Any) -> None:
    widgets.kubectl("apply", "-f", "-", input=yaml.safe_dump(widget()))
    meta = widgets.get("widgets", "w1")["metadata"]
    assert len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    assert "kubectl.kubernetes.io/last-applied-configuration" in meta["annotations"]


def test_kubectl_get_shows_the_crd_printer_columns(widgets: Any) -> None:
    widgets.create(widget("w1", size=7))
    widgets.create(widget("w2", size=2))
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    widgets.patch("widgets", "w1", {"status": status}, subresource="status")
    header, full, empty = rows(widgets.kubectl("get", "wd").stdout)
    assert header == ["NAME", "PHASE", "SIZE", "READY"]  # no AGE: the CRD's columns declare none
    assert full[:4] == ["w1", "Running", "7", "True"]
    assert empty[:2] == ["w2", "2"]  # PHASE and READY are blank: their paths are missing


def test_status_patch_changes_only_status_and_not_generation(widgets: Any) -> None:
    before = widgets.create(widget(size=3))
    patch = {"status": {"phase": "Ready"}, "spec": {"size": 99}}
    widgets.kubectl(
        "patch", "wd", "w1", "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    after = widgets.get("widgets", "w1")
    assert after["status"] == {"phase": "Ready"}
    assert after["spec"] == {"size": 3}
    assert after["metadata"]["generation"] == before["metadata"]["generation"] == 1
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


def test_spec_changes_bump_generation_but_status_and_labels_do_not(widgets: Any) -> None:
    widgets.create(widget(size=3))
    ignored = widgets.patch("widgets", "w1", {"status": {"phase": "X"}})
    assert "status" not in ignored and ignored["metadata"]["generation"] == 1
    labelled = widgets.patch("widgets", "w1", {"metadata": {"labels": {"colour": "blue"}}})
    assert labelled["metadata"]["generation"] == 1
    assert widgets.patch("widgets", "w1", {"spec": {"size": 4}})["metadata"]["generation"] == 2


def test_a_no_op_patch_keeps_the_resource_version(widgets: Any) -> None:
    created = widgets.create(widget(size=3))
    path = "/apis/example.dev/v1/namespaces/default/widgets/w1"
    reply = widgets.api(
        "PATCH", path, {"spec": {"size": 3}}, content_type="application/merge-patch+json"
    )
    assert reply.status == 200
    assert reply.json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_kubectl_get_watch_streams_changes(widgets: Any) -> None:
    widgets.create(widget(size=3))
    with widgets.kubectl_stream("get", "wd", "-w") as stream:
        stream.wait_for_line(lambda line: line.startswith("w1 "))
        widgets.patch("widgets", "w1", {"status": {"phase": "Done"}}, subresource="status")
        assert stream.wait_for_line(lambda line: "Done" in line).split()[:3] == ["w1", "Done", "3"]


def test_watch_resumes_after_the_given_resource_version(widgets: Any) -> None:
    widgets.create(widget("w1"))
    listed = widgets.api("GET", "/apis/example.dev/v1/namespaces/default/widgets").json()
    widgets.create(widget("w2"))
    widgets.patch("widgets", "w1", {"metadata": {"labels": {"a": "b"}}})
    since = listed["metadata"]["resourceVersion"]
    reply = widgets.api(
        "GET",
        "/apis/example.dev/v1/namespaces/default/widgets"
        f"?watch=true&resourceVersion={since}&timeoutSeconds=1",
    )
    assert reply.headers["Content-Type"].startswith("application/json")
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in reply.lines()]
    assert events == [("ADDED", "w2"), ("MODIFIED", "w1")]


def test_a_watch_with_a_selector_sees_objects_enter_and_leave_it(widgets: Any) -> None:
    widgets.create(widget("w1"))
    since = widgets.api("GET", "/apis/example.dev/v1/widgets").json()["metadata"]
    widgets.patch("widgets", "w1", {"metadata": {"labels": {"team": "a"}}})
    widgets.patch("widgets", "w1", {"metadata": {"labels": {"team": "b"}}})
    reply = widgets.api(
        "GET",
        "/apis/example.dev/v1/widgets?watch=true&labelSelector=team%3Da"
        f"&resourceVersion={since['resourceVersion']}&timeoutSeconds=1",
    )
    assert [event["type"] for event in reply.lines()] == ["ADDED", "DELETED"]


def test_lists_carry_kind_api_version_and_a_resource_version(widgets: Any) -> None:
    widgets.create(widget())
    listed = widgets.api("GET", "/apis/example.dev/v1/widgets").json()
    assert (listed["kind"], listed["apiVersion"]) == ("WidgetList", "example.dev/v1")
    item_version = listed["items"][0]["metadata"]["resourceVersion"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(item_version)


def test_failed_json_patch_test_is_422(widgets: Any) -> None:
    widgets.create(widget())
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/spec/size", "value": 9},
    ]
    reply = widgets.api(
        "PATCH",
        "/apis/example.dev/v1/namespaces/default/widgets/w1",
        ops,
        content_type="application/json-patch+json",
    )
    assert (reply.status, reply.json()["reason"]) == (422, "Invalid")
    assert widgets.get("widgets", "w1")["spec"]["size"] == 3


def test_discovery_serves_core_v1_and_the_crd_with_its_names(widgets: Any) -> None:
    assert widgets.api("GET", "/api/v1").json()["groupVersion"] == "v1"
    doc = widgets.api("GET", "/apis/example.dev/v1").json()
    entries = {entry["name"]: entry for entry in doc["resources"]}
    assert set(entries) == {"widgets", "widgets/status"}
    assert entries["widgets"]["shortNames"] == ["wd"]
    assert entries["widgets"]["categories"] == ["toys"]
    assert "watch" in entries["widgets"]["verbs"]
    resources = widgets.kubectl("api-resources", "--api-group=example.dev").stdout
    assert rows(resources)[1] == ["widgets", "wd", "example.dev/v1", "true", "Widget"]


def test_a_crd_applied_through_the_api_is_served(k8s: Any) -> None:
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(WIDGET_CRD))
    crd = k8s.get("crd", "widgets.example.dev", namespace=None)
    established = crd["status"]["conditions"][1]
    assert (established["type"], established["status"]) == ("Established", "True")
    k8s.create(widget())
    assert rows(k8s.kubectl("get", "wd", "-o", "name").stdout) == [["widget.example.dev/w1"]]


def test_namespaces_are_listed_and_fetched(k8s: Any) -> None:
    k8s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    listed = k8s.api("GET", "/api/v1/namespaces").json()
    assert listed["kind"] == "NamespaceList"
    assert {ns["metadata"]["name"] for ns in listed["items"]} == {"default", "team-a"}
    assert k8s.api("GET", "/api/v1/namespaces/team-a").json()["status"] == {"phase": "Active"}
    assert [row[:2] for row in rows(k8s.kubectl("get", "ns").stdout)] == [
        ["NAME", "STATUS"],
        ["default", "Active"],
        ["team-a", "Active"],
    ]


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def test_label_selectors_filter_pods(k8s: Any) -> None:
    for name, labels in (("p1", {"a": "b"}), ("p2", {"a": "c"}), ("p3", {"x": "z"})):
        k8s.create(pod(name, **labels))
    assert k8s.kubectl("get", "pods", "-l", "a=b", "-o", "name").stdout.split() == ["pod/p1"]
    selected = k8s.kubectl("get", "pods", "-l", "a in (b,c)", "-o", "name").stdout.split()
    assert selected == ["pod/p1", "pod/p2"]
    unlabelled = k8s.api("GET", "/api/v1/namespaces/default/pods?labelSelector=%21a").json()
    assert [p["metadata"]["name"] for p in unlabelled["items"]] == ["p3"]


def configmap_owned_by(owner: dict[str, Any], name: str = "w1-config") -> dict[str, Any]:
    ref = {
        "apiVersion": "example.dev/v1",
        "kind": "Widget",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "ownerReferences": [ref]},
        "data": {"k": "v"},
    }


def test_deleting_an_owner_deletes_what_it_owns_in_cascade(widgets: Any) -> None:
    child = widgets.create(configmap_owned_by(widgets.create(widget())))
    widgets.create(configmap_owned_by(child, "grandchild"))
    widgets.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned"}})
    widgets.kubectl("delete", "wd", "w1")
    assert [cm["metadata"]["name"] for cm in widgets.objects("configmaps")] == ["unowned"]


def test_orphan_propagation_keeps_dependents_without_the_reference(widgets: Any) -> None:
    widgets.create(configmap_owned_by(widgets.create(widget())))
    widgets.kubectl("delete", "wd", "w1", "--cascade=orphan")
    assert widgets.get("widgets", "w1") is None
    assert widgets.get("configmaps", "w1-config")["metadata"]["ownerReferences"] == []


def test_finalizers_hold_deletion_until_removed(widgets: Any) -> None:
    held = widget()
    held["metadata"]["finalizers"] = ["example.dev/cleanup"]
    widgets.create(configmap_owned_by(widgets.create(held)))
    path = "/apis/example.dev/v1/namespaces/default/widgets/w1"
    assert widgets.api("DELETE", path).status == 200
    assert widgets.get("widgets", "w1")["metadata"]["deletionTimestamp"]
    assert widgets.get("configmaps", "w1-config") is not None
    reply = widgets.api(
        "PATCH",
        path,
        [{"op": "remove", "path": "/metadata/finalizers"}],
        content_type="application/json-patch+json",
    )
    assert reply.status == 200
    assert widgets.get("widgets", "w1") is None
    assert widgets.get("configmaps", "w1-config") is None


def test_kubectl_wait_for_jsonpath_sees_a_later_status(widgets: Any) -> None:
    widgets.create(widget())
    waiting = subprocess.Popen(
        widgets.kubectl_argv(
            "wait", "wd/w1", "--for=jsonpath={.status.phase}=Ready", "--timeout=30s"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    widgets.wait_for(
        lambda: any(c.verb == "watch" and c.resource == "widgets" for c in widgets.requests),
        message="kubectl wait to watch",
    )
    assert waiting.poll() is None  # not Ready yet
    widgets.patch("widgets", "w1", {"status": {"phase": "Ready"}}, subresource="status")
    out, err = waiting.communicate(timeout=40)
    assert waiting.returncode == 0, err
    assert "condition met" in out


def test_kubectl_describe_shows_the_widget_and_its_events(widgets: Any) -> None:
    uid = widgets.create(widget(size=5))["metadata"]["uid"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "w1-"},
        "involvedObject": {
            "apiVersion": "example.dev/v1",
            "kind": "Widget",
            "name": "w1",
            "namespace": "default",
            "uid": uid,
        },
        "reason": "Sized",
        "message": "size is five",
        "type": "Normal",
    }
    created = widgets.api("POST", "/api/v1/namespaces/default/events", event)
    assert created.status == 201 and created.json()["metadata"]["name"].startswith("w1-")
    described = widgets.kubectl("describe", "wd", "w1").stdout
    assert "Kind:         Widget" in described and "Size:  5" in described
    assert "Sized" in described and "size is five" in described


def test_requests_are_recorded_with_rbac_verbs_and_statuses(widgets: Any) -> None:
    widgets.kubectl("apply", "-f", "-", input=yaml.safe_dump(widget()))
    widgets.kubectl("delete", "wd", "w1")
    calls = [
        (c.verb, c.rbac_resource, c.status) for c in widgets.requests if c.resource == "widgets"
    ]
    assert ("get", "widgets", 404) in calls
    assert ("create", "widgets", 201) in calls
    assert ("delete", "widgets", 200) in calls
    assert sum(c.is_write for c in widgets.requests) == 2  # direct writes are not requests


def test_kopf_operator_handles_a_widget_once_and_stops_cleanly(widgets: Any) -> None:
    import kopf

    registry = kopf.OperatorRegistry()
    created: list[str] = []
    resized: list[int] = []
    deleted = threading.Event()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=widgets.url, insecure=True)

    @kopf.on.create("example.dev", "v1", "widgets", registry=registry, id="configure")
    def configure(body: Any, name: str, namespace: str, patch: Any, **_: Any) -> None:
        created.append(name)
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-cm"},
            "data": {"size": str(body["spec"]["size"])},
        }
        kopf.adopt(configmap, owner=body, strict=True)
        reply = widgets.api("POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap)
        assert reply.status == 201, reply.body
        patch.status["phase"] = "Configured"

    @kopf.on.update(
        "example.dev", "v1", "widgets", registry=registry, id="resize", field="spec.size"
    )
    def resize(new: int, **_: Any) -> None:
        resized.append(new)

    @kopf.on.delete("example.dev", "v1", "widgets", registry=registry, id="farewell")
    def farewell(**_: Any) -> None:
        deleted.set()

    with widgets.operator(registry):
        widgets.create(widget(size=3))
        owner = widgets.wait_for(lambda: phase_is(widgets, "Configured"))
        configmap = widgets.get("configmaps", "w1-cm")
        assert configmap["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        widgets.patch("widgets", "w1", {"spec": {"size": 4}})
        widgets.wait_for(lambda: resized == [4], message="the update handler")
        assert created == ["w1"]  # kopf's own patches after the create ran nothing again
        widgets.kubectl("delete", "wd", "w1", "--timeout=30s")  # waits for kopf's finalizer
        assert deleted.is_set()
        assert widgets.get("configmaps", "w1-cm") is None
    assert not [c for c in widgets.requests if c.status and c.status >= 500]


def phase_is(k8s: Any, phase: str) -> dict[str, Any] | None:
    found = k8s.get("widgets", "w1")
    return found if found and found.get("status", {}).get("phase") == phase else None


@pytest.mark.asyncio
async def test_kopf_can_run_in_the_tests_event_loop_beside_async_kubectl(widgets: Any) -> None:
    import kopf

    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=widgets.url, insecure=True)

    @kopf.on.create("example.dev", "v1", "widgets", registry=registry, id="mark")
    def mark(patch: Any, **_: Any) -> None:
        patch.status["phase"] = "Seen"

    stop = asyncio.Event()
    running = asyncio.create_task(
        kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop)
    )
    try:
        await widgets.kubectl_async("apply", "-f", "-", input=yaml.safe_dump(widget()))
        await widgets.wait_for_async(lambda: phase_is(widgets, "Seen"), message="the handler")
        shown = await widgets.kubectl_async("get", "wd", "w1", "-o", "jsonpath={.status.phase}")
        assert shown.stdout == "Seen"
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


def test_label_selector_syntax() -> None:
    labelled = {"metadata": {"labels": {"app": "web", "tier": "front"}}}
    assert label_selector("app=web,tier!=back")(labelled)
    assert label_selector("app in (api, web), !missing")(labelled)
    assert not label_selector("app notin (web)")(labelled)
    assert not label_selector("missing")(labelled)


def test_field_selector_and_jsonpath() -> None:
    event = {
        "involvedObject": {"name": "w1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "Synced", "status": "True"},
            ]
        },
    }
    assert field_selector("involvedObject.name=w1")(event)
    assert not field_selector("involvedObject.name!=w1")(event)
    assert jsonpath(event, '.status.conditions[?(@.type=="Synced")].status') == ["True"]
    assert jsonpath(event, ".status.conditions[*].type") == ["Ready", "Synced"]
    assert jsonpath(event, ".status.missing") == []


def test_ages_read_as_kubectl_shows_them() -> None:
    assert [human_age(s) for s in (5, 150, 1800, 4 * 3600 + 60, 3 * 86400)] == [
        "5s",
        "2m30s",
        "30m",
        "4h1m",
        "3d",
    ]
