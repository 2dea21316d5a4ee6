"""Pods of the test kubelet that run in a real container image, with Podman: the operator's image
(operator/Dockerfile), built once per content and run as the pod says.

The image is built for real from what goes into it (the Dockerfile, pyproject.toml, README.md and
scalerl/), tagged with a hash of those files, so a second session with the same sources finds it in
Podman's store and builds nothing. Its base is Debian bookworm made with mmdebstrap
(images/base-image.sh, `make base-image`): python:3.11-slim-bookworm cannot be pulled here.

A pod's container runs with `podman run --rm` in the foreground, so the kubelet still watches one
process: the `podman run` client, which exits with the container's exit code (128 + signal when
killed, as a kubelet reports it). Signals go to the container itself (`podman kill`): SIGKILL to the
client alone would leave the container running under conmon. The container shares this machine's
network, as the kubelet's local processes do (kubelet_plan.py makes ports and Service names local),
and sees the kubelet's files at their own paths (the plan's paths are local ones), with the pod's
volumes also at their mountPaths (the chart's emptyDir on /tmp). The pod's securityContext is
applied: its user and group, a read-only root filesystem, no capabilities, no privilege escalation.

    image = operator_image()                   # built, or found by its content hash
    Kubelet(plane, ns, images={Images().fit: image})
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubelet_plan import ProcessPlan

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/scalerl/base:bookworm"
OPERATOR_REPOSITORY = "localhost/scalerl/operator"
SANDBOX_REPOSITORY = "localhost/scalerl/sandbox-check"
# hostUsers: false as Podman's id map: container ids 0-65535 are these ids on this machine.
USER_NAMESPACE_MAP = "0:200000:65536"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # a container's default terminationMessagePath
# What the operator's Dockerfile copies (tests/test_images.py holds it to the .dockerignore).
OPERATOR_INPUTS = ("operator/Dockerfile", "pyproject.toml", "README.md", "scalerl")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # pip's CA bundle inside a build
BUILD_TIMEOUT_S = 1200.0
# This machine does not let runc raise a limit (no CAP_SYS_RESOURCE), and Podman's defaults for
# root (nofile 1048576, nproc 32768) are above ours: a container gets our open-file limit and a
# process limit any pod here stays under.
NPROC = 4096


def podman_missing() -> str | None:
    """Why Podman cannot run images here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman buildah mmdebstrap uidmap)"
    done = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"podman info failed: {done.stderr.strip()[-300:]}"
    return None


def require_podman() -> None:
    """Skip without Podman, saying how to get it; under CI fail: CI installs it (.ci/run)."""
    why = podman_missing()
    if why is None:
        return
    message = f"{why}; then the tests build the operator image themselves"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def content_hash(paths: tuple[str, ...] = OPERATOR_INPUTS, root: Path = ROOT) -> str:
    """sha256 over the relative path and bytes of every file under `paths` (bytecode left out,
    as .dockerignore leaves it out of the build context)."""
    digest = hashlib.sha256()
    for top in paths:
        found = [root / top] if (root / top).is_file() else sorted((root / top).rglob("*"))
        for path in found:
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], timeout=60).returncode == 0


@functools.cache
def operator_image() -> str:
    """The operator's image built from this checkout on the local base: its tag. Built once per
    content (its tag carries the hash); the base is made first where it is missing."""
    require_podman()
    tag = f"{OPERATOR_REPOSITORY}:src-{content_hash()[:16]}"
    if image_exists(tag):
        return tag
    started = time.monotonic()
    ensure_base_image()
    build = ["podman", "build", "--isolation", "chroot", "--build-arg", f"BASE={BASE_IMAGE}"]
    if HOST_CA.is_file():  # behind a TLS-inspecting proxy, pip needs this host's CA bundle
        build += ["--volume", f"{HOST_CA}:/run/host-ca.crt:ro"]
        build += ["--build-arg", "PIP_CERT=/run/host-ca.crt"]
    _run([*build, "-f", "operator/Dockerfile", "-t", tag, "."], "the operator image")
    print(f"built {tag} in {time.monotonic() - started:.0f} s")
    _untag_others(tag)
    return tag


@functools.cache
def sandbox_image() -> str:
    """The operator's image with Debian's bubblewrap added, as the generator image installs it
    (images/generator/Dockerfile): an image that can make the code sandbox, without the
    generator's torch and vLLM, for the sandbox check's pods. This machine's bwrap (the same
    Debian release as the base: its libraries are in the image) is copied in: no download."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.fail("bubblewrap is not installed here (apt-get install bubblewrap)")
    base = operator_image()
    tag = f"{SANDBOX_REPOSITORY}:{base.rsplit(':', 1)[1]}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory() as context:
        shutil.copy2(bwrap, Path(context) / "bwrap")
        (Path(context) / "Dockerfile").write_text(f"FROM {base}\nCOPY bwrap /usr/bin/bwrap\n")
        _run(["podman", "build", "--isolation", "chroot", "-t", tag, context], "the sandbox image")
    return tag


def _untag_others(tag: str) -> None:
    """Builds of other sources go, and the sandbox images built on them (their layers shared with
    this one stay, as the build cache): Podman's store, which CI caches, holds one operator image
    of the tests."""
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    ours = (f"{OPERATOR_REPOSITORY}:src-", f"{SANDBOX_REPOSITORY}:src-")  # and what is built on it
    old = [t for t in listed if t.startswith(ours) and t.rsplit(":", 1)[1] != tag.rsplit(":", 1)[1]]
    if old:
        subprocess.run(["podman", "rmi", *old], capture_output=True, timeout=120)
        # Their own layers, no longer under any tag (the build cache under this one stays).
        subprocess.run(["podman", "image", "prune", "--force"], capture_output=True, timeout=300)


def ensure_base_image() -> None:
    """`make base-image`: skipped when the image is in Podman's store."""
    _run([str(ROOT / "images" / "base-image.sh"), BASE_IMAGE], "the base image")


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"building {what} failed ({done.returncode}):\n{done.stderr[-3000:]}")


# --- running a pod's container ------------------------------------------------------------------


def container_name(pod: dict[str, Any]) -> str:
    """The Podman container of a pod: unique per pod (its uid), as a pod's sandbox is."""
    return f"kl-{pod['metadata']['name'][:40]}-{pod['metadata']['uid'][:8]}"


def podman_run(
    pod: dict[str, Any],
    plan: ProcessPlan,
    image: str,
    scratch: Path,
    claim_dir: Callable[[str], Path],
    ca: Path,
    extra_env: Mapping[str, str],
) -> list[str]:
    """The kubelet's plan for the pod (its files under `scratch`, its claims from `claim_dir`)
    as `podman run` in `image`: the plan's local paths at their own paths (its env and args name
    them), the pod's volumes at their mountPaths too, and the API server's CA."""
    volumes = {}
    for volume in pod["spec"].get("volumes") or []:  # where kubelet_plan put each volume
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        volumes[volume["name"]] = (
            claim_dir(claim) if claim else scratch / "volumes" / volume["name"]
        )
    outside = [d for d in plan.dirs if not d.is_relative_to(scratch)]  # claims
    binds = [*pod_binds(pod, volumes, [scratch, *outside]), (ca, f"{ca}:ro")]
    # The file a kubelet mounts for the container's termination message, read when it ends.
    message = termination_log(scratch)
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_bytes(b"")
    message.chmod(0o666)  # whatever user (and user namespace) the container runs as
    path = pod["spec"]["containers"][0].get("terminationMessagePath", TERMINATION_MESSAGE_PATH)
    binds.append((message, path))
    # TMPDIR is the local processes' scratch; a container has only what its pod mounts.
    env = {k: v for k, v in plan.env.items() if k != "TMPDIR"} | dict(extra_env)
    return run_argv(pod, image, container_name(pod), env, plan.argv, binds)


def termination_log(scratch: Path) -> Path:
    """Where a pod's container writes its termination message, on this machine."""
    return scratch / "termination-log"


def run_argv(
    pod: dict[str, Any],
    image: str,
    name: str,
    env: Mapping[str, str],
    argv: list[str],
    binds: list[tuple[Path, str]],
) -> list[str]:
    """`podman run` of the pod's only container: `argv` as its command (Kubernetes' `command`
    replaces the image's entrypoint), `env` its whole environment, `binds` host path -> path in
    the container (read-only where the pod's mount says so, or ending in ':ro')."""
    container = pod["spec"]["containers"][0]
    out = ["podman", "run", "--rm", "--name", name, "--network", "host"]
    out += ["--hostname", pod["spec"].get("hostname") or pod["metadata"]["name"]]
    out += limits() + _security(pod, container)
    for host, inside in binds:
        out += ["--volume", f"{host}:{inside}"]
    for key, value in env.items():
        out += ["--env", f"{key}={value}"]
    out += ["--entrypoint", json.dumps(argv[:1]), "--workdir", container.get("workingDir") or "/"]
    return [*out, image, *argv[1:]]


def limits() -> list[str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={NPROC}:{NPROC}"]


def _security(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """The pod's and container's securityContext (the container's wins) as Podman's flags."""
    context = {
        **(pod["spec"].get("securityContext") or {}),
        **(container.get("securityContext") or {}),
    }
    out = []
    if pod["spec"].get("hostUsers") is False:
        # A user namespace of its own: the container's ids 0-65535 are these ids here (a
        # kubelet picks a free range per pod; Podman as root needs no /etc/subuid for this).
        out += ["--uidmap", USER_NAMESPACE_MAP, "--gidmap", USER_NAMESPACE_MAP]
    if context.get("procMount") == "Unmasked":
        out += ["--security-opt", "unmask=ALL"]
    user = context.get("runAsUser")
    if user is not None:
        out += ["--user", f"{user}:{context.get('runAsGroup', user)}"]
    if context.get("fsGroup") is not None:
        out += ["--group-add", str(context["fsGroup"])]
    if context.get("readOnlyRootFilesystem"):
        # Only what the pod mounts is writable: no tmpfs of Podman's own on /tmp.
        out += ["--read-only", "--read-only-tmpfs=false"]
    dropped = (context.get("capabilities") or {}).get("drop") or []
    if "ALL" in dropped:
        out += ["--cap-drop", "all"]
    if context.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    return out


def kill(name: str, sig: signal.Signals) -> None:
    """Signal the container's main process (nothing when it is gone)."""
    subprocess.run(["podman", "kill", "--signal", sig.name, name], capture_output=True, timeout=60)


def remove(name: str) -> None:
    """The container gone for good, whatever `--rm` managed (a killed `podman run` client)."""
    subprocess.run(
        ["podman", "rm", "--force", "--ignore", "--time", "0", name],
        capture_output=True,
        timeout=60,
    )


def main_pid(name: str) -> int | None:
    """The container's main process on this machine, while it runs."""
    done = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = done.stdout.strip()
    return int(pid) if done.returncode == 0 and pid.isdigit() and int(pid) > 0 else None


def pod_binds(
    pod: dict[str, Any], volumes: Mapping[str, Path], local: list[Path]
) -> list[tuple[Path, str]]:
    """(host path, container path): each of `local` at its own path (the plan names them so), and
    each volumeMount of the container at its mountPath (`volumes`: volume name -> its directory
    here), read-only where it says so."""
    binds = [(path, str(path)) for path in local]
    container = pod["spec"]["containers"][0]
    for mount in container.get("volumeMounts") or []:
        source = volumes[mount["name"]] / mount.get("subPath", "")
        suffix = ":ro" if mount.get("readOnly") else ""
        binds.append((source, mount["mountPath"] + suffix))
    return binds


if __name__ == "__main__":
    # `make test-images`, which `make test` runs first: the tests then find the image built and
    # download nothing themselves (the build installs from Debian's and PyPI's mirrors).
    absent = podman_missing()
    print(f"test-images: {absent}; the image tests say so" if absent else sandbox_image())
