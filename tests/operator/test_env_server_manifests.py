"""A run with an OpenEnv server (spec.environment.openenv.image) and environment packages
(spec.environment.packages): the server's Deployment and Service, the URL the generators get,
the NetworkPolicy that lets them reach it, and the init container that installs the packages,
which is run here as its command says, against a package index on 127.0.0.1."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from small_run import run_manifest

from scalerl.environment import OPENENV_URL_VAR
from scalerl.errors import SpecError
from scalerl.operator import manifests, names
from scalerl.operator.manifests import Images, Owner
from scalerl.ports import free_port
from scalerl.rollout.keys import StreamKeys
from scalerl.spec import ScaleRLRun, parse_run

ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.30.0"  # the chart's kubeVersion floor
OWNER = Owner("agent", "research", "0b7c5a52-3f3e-4c0e-9d8e-5b1f0c2d9a11")
KEYS = StreamKeys.generate()
SERVER = {"image": "registry.example/calculator:1", "port": 8000, "replicas": 2}


def agent_run(openenv: dict[str, Any] | None = None, **spec: Any) -> ScaleRLRun:
    environment = spec.pop("environment", {})
    body = {"openenv": openenv or SERVER, **environment}
    return parse_run(run_manifest(OWNER.namespace, OWNER.name, environment=body, **spec))


def children(run: ScaleRLRun) -> list[dict[str, Any]]:
    return manifests.children(run, OWNER, 0, Images(), KEYS)


def find(objs: list[dict[str, Any]], kind: str, role: str) -> dict[str, Any]:
    (found,) = [
        o for o in objs if o["kind"] == kind and o["metadata"]["labels"][names.LABEL_ROLE] == role
    ]
    return found


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"])


def environ(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_server_is_a_deployment_and_a_service_owned_by_the_run_and_schema_valid() -> None:
    objs = children(agent_run())
    deployment, service = find(objs, "Deployment", "env"), find(objs, "Service", "env")
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "agent-env"
    for obj in (deployment, service):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == SERVER["image"]
    assert container["ports"][0]["containerPort"] == 8000
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    pod_labels = spec["template"]["metadata"]["labels"]
    assert selects(spec["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)  # the Service reaches those pods
    assert service["spec"]["ports"][0]["targetPort"] == 8000
    # Created after the NetworkPolicy, as every pod of the run is.
    kinds = [o["kind"] for o in objs]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")


def test_the_generators_get_the_services_url_and_the_trainer_does_not() -> None:
    objs = children(agent_run())
    url = environ(pod_of(find(objs, "Job", "generator")))[OPENENV_URL_VAR]
    assert url == "http://agent-env.research.svc:8000"  # the Service's in-cluster DNS name
    assert OPENENV_URL_VAR not in environ(pod_of(find(objs, "Job", "trainer")))


def test_a_colocated_run_gets_the_url_in_its_one_pod() -> None:
    run = agent_run(placement="colocated", generators={"replicas": 1})
    objs = children(run)
    assert OPENENV_URL_VAR in environ(pod_of(find(objs, "Job", "trainer")))
    assert find(objs, "Deployment", "env")["spec"]["replicas"] == 2


def test_the_network_policy_lets_the_runs_pods_and_only_them_reach_the_server() -> None:
    objs = children(agent_run())
    (policy,) = [
        o["spec"] for o in objs if o["metadata"]["name"] == names.network_policy(OWNER.name)
    ]
    server_pod = find(objs, "Deployment", "env")["spec"]["template"]["metadata"]["labels"]
    generator_pod = pod_of(find(objs, "Job", "generator"))["metadata"]["labels"]
    assert selects(policy["podSelector"]["matchLabels"], server_pod)  # the server is protected
    (from_run,) = [rule for rule in policy["ingress"] if "ports" not in rule]
    (peer,) = from_run["from"]
    assert selects(peer["podSelector"]["matchLabels"], generator_pod)  # on every port
    stranger = {**generator_pod, names.LABEL_RUN: "another-run"}
    assert not selects(peer["podSelector"]["matchLabels"], stranger)


def test_a_suspended_run_keeps_the_servers_service_and_no_pods() -> None:
    objs = children(agent_run(suspend=True))
    assert [o["kind"] for o in objs if o["metadata"]["labels"][names.LABEL_ROLE] == "env"] == [
        "Service"
    ]


@pytest.mark.parametrize(
    "openenv",
    [
        {"url": "http://calculator.tools.svc:8000", "image": "registry.example/calculator:1"},
        {"app": "openenv_calculator.server:app"},
    ],
)
def test_no_server_is_made_for_a_running_one_or_a_local_app(openenv: dict[str, Any]) -> None:
    objs = children(agent_run(openenv))
    assert not [o for o in objs if o["metadata"]["labels"][names.LABEL_ROLE] == "env"]
    assert OPENENV_URL_VAR not in environ(pod_of(find(objs, "Job", "generator")))


@settings(max_examples=30, deadline=None)
@given(port=st.integers(1, 65535), replicas=st.integers(1, 16))
def test_one_port_everywhere_the_server_is_reached(port: int, replicas: int) -> None:
    objs = children(agent_run({**SERVER, "port": port, "replicas": replicas}))
    deployment, service = find(objs, "Deployment", "env"), find(objs, "Service", "env")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    url = environ(pod_of(find(objs, "Job", "generator")))[OPENENV_URL_VAR]
    assert {
        container["ports"][0]["containerPort"],
        container["readinessProbe"]["httpGet"]["port"],
        service["spec"]["ports"][0]["port"],
        service["spec"]["ports"][0]["targetPort"],
        int(url.rsplit(":", 1)[1]),
    } == {port}
    assert deployment["spec"]["replicas"] == replicas


# --- spec.environment.packages -------------------------------------------------------------------

INDEX_URL = "https://pypi.internal.example/simple"


def packaged_run(**spec: Any) -> ScaleRLRun:
    environment = {"packages": ["openenv-calculator==0.1.0"], "indexUrl": INDEX_URL}
    return agent_run(environment=environment, **spec)


def test_the_generator_pods_install_the_packages_at_start_onto_their_python_path() -> None:
    objs = children(packaged_run(checkpoint={"claimName": "ckpt", "createRunDirectory": True}))
    pod = pod_of(find(objs, "Job", "generator"))["spec"]
    init = {c["name"]: c for c in pod["initContainers"]}
    assert sorted(init) == ["environment-packages", "run-directory"]
    packages = init["environment-packages"]
    assert packages["image"] == pod["containers"][0]["image"]  # the generator's own pip
    assert packages["command"][-3:] == ["--index-url", INDEX_URL, "openenv-calculator==0.1.0"]
    assert "--no-deps" in packages["command"]
    folder = packages["volumeMounts"][0]["mountPath"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[folder]["readOnly"] and mounts[folder]["name"] == "environment-packages"
    assert environ({"spec": pod})["PYTHONPATH"] == folder
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["environment-packages"] == {"name": "environment-packages", "emptyDir": {}}
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_the_disaggregated_trainer_installs_nothing_and_a_colocated_pod_does() -> None:
    trainer = pod_of(find(children(packaged_run()), "Job", "trainer"))["spec"]
    assert "initContainers" not in trainer and "PYTHONPATH" not in environ({"spec": trainer})
    colocated = packaged_run(placement="colocated", generators={"replicas": 1})
    one = pod_of(find(children(colocated), "Job", "trainer"))["spec"]
    assert [c["name"] for c in one["initContainers"]] == ["environment-packages"]


INDEX_PASSWORD = "idx-pass-6c1e0f"  # noqa: S105 - the test index's own


def test_an_index_url_with_credentials_is_refused_for_the_secret() -> None:
    """Anyone who reads the run or its pods would read the password: the spec says where the
    URL goes instead, and never repeats the password."""
    with pytest.raises(SpecError) as err:
        agent_run(
            environment={
                "packages": ["calc==1"],
                "indexUrl": f"https://bot:{INDEX_PASSWORD}@pypi.internal.example/simple",
            }
        )
    said = " ".join(err.value.problems)
    assert "indexUrl holds credentials" in said and "indexSecret" in said
    assert INDEX_PASSWORD not in str(err.value)
    with pytest.raises(SpecError, match="token"):
        agent_run(environment={"packages": ["calc==1"], "indexUrl": f"{INDEX_URL}?token=abc123"})


HOSTS = st.sampled_from(["pypi.internal.example", "10.0.0.7:8080", "idx.example"])
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=4, max_size=12)


@settings(max_examples=40, deadline=None)
@given(
    host=HOSTS,
    user=WORDS,
    password=WORDS.map(lambda w: f"pw-{w}"),  # never a word of the error's own text
    param=st.sampled_from(["token", "api_key", "access_token", "password"]),
    shape=st.sampled_from(["userinfo", "user", "query"]),
)
def test_no_credentialed_index_url_reaches_a_pod(
    host: str, user: str, password: str, param: str, shape: str
) -> None:
    """However the credentials sit in the URL, the spec refuses it; the same URL without them
    is the init container's --index-url as written."""
    plain = f"https://{host}/simple"
    url = {
        "userinfo": f"https://{user}:{password}@{host}/simple",
        "user": f"https://{user}@{host}/simple",
        "query": f"{plain}?{param}={password}",
    }[shape]
    with pytest.raises(SpecError) as err:
        agent_run(environment={"packages": ["calc==1"], "indexUrl": url})
    assert password not in str(err.value)
    objs = children(agent_run(environment={"packages": ["calc==1"], "indexUrl": plain}))
    (init,) = pod_of(find(objs, "Job", "generator"))["spec"]["initContainers"]
    assert init["command"][-3:] == ["--index-url", plain, "calc==1"]


def test_a_private_index_reaches_pip_from_its_secret_and_no_command() -> None:
    index = {"name": "pip-index", "key": "url"}
    objs = children(agent_run(environment={"packages": ["calc==1"], "indexSecret": index}))
    pod = pod_of(find(objs, "Job", "generator"))["spec"]
    (init,) = pod["initContainers"]
    assert init["env"] == [
        {
            "name": "PIP_INDEX_URL",
            "valueFrom": {"secretKeyRef": {"name": "pip-index", "key": "url"}},
        }
    ]
    assert "--index-url" not in init["command"]
    assert "env" not in pod["containers"][0] or all(
        e["name"] != "PIP_INDEX_URL" for e in pod["containers"][0]["env"]
    )  # the generator itself never holds it
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def _index_folder(tmp_path: Path) -> Path:
    """The calculator package as a wheel in a PEP 503 index folder."""
    project = tmp_path / "index" / "openenv-calculator"
    project.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(project), str(ROOT / "environments" / "openenv_calculator")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = project.glob("*.whl")
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>')
    return tmp_path / "index"


@pytest.fixture
def package_index(tmp_path: Path) -> Iterator[str]:
    """The calculator package as a wheel in a PEP 503 index served on 127.0.0.1."""
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(_index_folder(tmp_path))
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _PasswordIndex(http.server.SimpleHTTPRequestHandler):
    """An index that answers only requests with its user and password (HTTP Basic)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        wanted = base64.b64encode(f"bot:{INDEX_PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != f"Basic {wanted}":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()
            return
        super().do_GET()


def test_pip_installs_from_the_private_index_the_secret_names_and_prints_no_password(
    tmp_path: Path,
) -> None:
    """The init container as the pod runs it, PIP_INDEX_URL set as the kubelet sets it from the
    Secret: the package installs from an index that wants the password, and nothing pip prints
    holds it."""
    handler = functools.partial(_PasswordIndex, directory=str(_index_folder(tmp_path)))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://bot:{INDEX_PASSWORD}@127.0.0.1:{server.server_address[1]}/"
    try:
        index = {"name": "pip-index"}
        run = agent_run(
            environment={"packages": ["openenv-calculator==0.1.0"], "indexSecret": index}
        )
        (init,) = pod_of(find(children(run), "Job", "generator"))["spec"]["initContainers"]
        folder = tmp_path / "pod-packages"
        command = [sys.executable if part == "python3" else part for part in init["command"]]
        command = [str(folder) if part == manifests.ENV_PACKAGES_DIR else part for part in command]
        (variable,) = init["env"]
        assert variable["valueFrom"]["secretKeyRef"] == {
            "name": "pip-index",
            "key": "PIP_INDEX_URL",
        }
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        done = subprocess.run(
            [*command, "-v"],
            env={**clean, variable["name"]: url},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(folder.glob("openenv_calculator*"))
    assert "Looking in indexes: http://bot:****@127.0.0.1" in done.stdout
    assert INDEX_PASSWORD not in done.stdout + done.stderr


def test_the_init_containers_command_installs_what_the_process_then_imports(
    package_index: str, tmp_path: Path
) -> None:
    """The command as the pod runs it (this interpreter for the image's python3, a temporary
    folder for the pod's), then the process's PYTHONPATH: the package imports from there."""
    run = agent_run(
        environment={"packages": ["openenv-calculator==0.1.0"], "indexUrl": package_index}
    )
    pod = pod_of(find(children(run), "Job", "generator"))["spec"]
    (init,) = pod["initContainers"]
    folder = tmp_path / "pod-packages"
    command = [sys.executable if part == "python3" else part for part in init["command"]]
    command = [str(folder) if part == manifests.ENV_PACKAGES_DIR else part for part in command]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    probe = "import openenv_calculator.arithmetic as a; print(a.__file__, a.evaluate('6*7'))"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [sys.executable, "-c", probe],
        env={**clean, "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(folder) and where[1] == "42"
