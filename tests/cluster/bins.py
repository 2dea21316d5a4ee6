"""Build the real control plane the operator's tests run against, from Go modules, once.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl of Kubernetes `K8S`,
helm `HELM`, and the Kueue and JobSet controllers (`KUEUE`, `JOBSET`: gang admission) go into
`$SCALERL_CACHE/k8s/v<K8S>/bin` (default `~/.cache/scalerl`), with Go's module and build caches
beside them, so a second call finds them and returns at once. Nothing of it is committed.

k8s.io/kubernetes cannot be `go install`ed: its go.mod requires its staging modules at v0.0.0 and
maps them to `./staging/...`, which Go ignores in a dependency. So the binaries are built in a
scratch module of ours that requires k8s.io/kubernetes and replaces each staging module by its
published v0.<minor>.<patch> release; the list of staging modules is read from k8s.io/kubernetes's
own go.mod, not written here. Helm gets a scratch module of its own, so its client-go never meets
Kubernetes' in one module graph. Kueue and JobSet are built in copies of their own modules (their
go.mod and go.sum as released; Kueue without the kube-scheduler library, which only its
SchedulerLibraryIntegration feature gate uses), with their CRD and webhook manifests beside them
(`controllers_dir()`), as their releases install them.

    python tests/cluster/bins.py            # builds what is missing; prints the bin directory
    python tests/cluster/bins.py --check    # exit 1 (and say what) when something is missing
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

K8S = "1.37.2"
HELM = "v4.3.1"
KUEUE = "v0.19.2"
JOBSET = "v0.12.0"
# name -> (module, main package in it, build tags)
CONTROLLERS = {
    "kueue": ("sigs.k8s.io/kueue", KUEUE, "./cmd/kueue", "exclude_scheduler_library"),
    "jobset": ("sigs.k8s.io/jobset", JOBSET, ".", ""),
}
STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/src/k8s\.io/[\w.-]+\s*$")
K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def cache_root() -> Path:
    return Path(os.environ.get("SCALERL_CACHE") or Path.home() / ".cache" / "scalerl") / "k8s"


def bin_dir() -> Path:
    return cache_root() / f"v{K8S}" / "bin"


def controller_source(name: str) -> Path:
    """The copy of controller `name`'s module it is built in; its config/ holds the CRDs and
    webhook manifests the tests install."""
    module, version, _, _ = CONTROLLERS[name]
    return cache_root() / "src" / f"{module.rsplit('/', 1)[1]}@{version}"


def controller_binary(name: str) -> Path:
    return bin_dir() / f"{name}-{CONTROLLERS[name][1]}"


def go_env() -> dict[str, str]:
    root = cache_root()
    return {
        **os.environ,
        "GOMODCACHE": str(root / "gomod"),
        "GOCACHE": str(root / "gobuild"),
        "GOFLAGS": "-mod=mod -buildvcs=false",
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
    }


def go_command() -> str:
    """`go` from PATH, else where the Go distribution installs it."""
    found = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(p).exists()), None
    )
    if found is None:
        raise SystemExit("no Go toolchain: install Go 1.26 (the control plane is built from it)")
    return found


def go(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [go_command(), *args], cwd=cwd, env=go_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed in {cwd}:\n{done.stderr[-4000:]}")
    return done.stdout


def missing() -> list[str]:
    """The binaries that are absent or of another version."""
    out = []
    for name, version_args, wanted in (
        ("etcd", ["--version"], "etcd Version: 3."),
        ("kube-apiserver", ["--version"], f"Kubernetes v{K8S}"),
        ("kube-controller-manager", ["--version"], f"Kubernetes v{K8S}"),
        ("kube-scheduler", ["--version"], f"Kubernetes v{K8S}"),
        ("kubectl", ["version", "--client"], f"v{K8S}"),
        ("helm", ["version", "--short"], HELM.rsplit(".", 1)[0]),
    ):
        path = bin_dir() / name
        try:
            said = subprocess.run(
                [str(path), *version_args], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            said = ""
        if wanted not in said:
            out.append(name)
    for name in CONTROLLERS:
        if (
            not controller_binary(name).exists()
            or not (controller_source(name) / "config").is_dir()
        ):
            out.append(name)
    return out


def staging_modules(scratch: Path) -> list[str]:
    """k8s.io/<x> for every `k8s.io/<x> => ./staging/...` line of k8s.io/kubernetes's go.mod."""
    info = json.loads(go("mod", "download", "-json", f"k8s.io/kubernetes@v{K8S}", cwd=scratch))
    lines = Path(info["GoMod"]).read_text().splitlines()
    found = sorted({m.group(1) for line in lines if (m := STAGING.match(line))})
    if not found:
        raise SystemExit(f"no staging modules found in {info['GoMod']}")
    return found


def k8s_ldflags() -> str:
    major, minor, _ = K8S.split(".")
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion=v{K8S}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(["-s", "-w", *flags])


def build_kubernetes(out: Path) -> None:
    scratch = cache_root() / "src" / "kubernetes"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "go.mod").write_text("module scalerl.dev/controlplane\n\ngo 1.26\n")
    replaces = [f"{m}={m}@v0.{K8S.split('.', 1)[1]}" for m in staging_modules(scratch)]
    go("mod", "edit", f"-require=k8s.io/kubernetes@v{K8S}", cwd=scratch)
    for replace in replaces:
        go("mod", "edit", f"-replace={replace}", cwd=scratch)
    go("get", f"k8s.io/kubernetes@v{K8S}", "go.etcd.io/etcd/server/v3", cwd=scratch)
    packages = [f"k8s.io/kubernetes/cmd/{name}" for name in K8S_COMMANDS]
    for package in packages:
        name = package.rsplit("/", 1)[1]
        go(
            "build",
            "-p",
            "2",
            "-ldflags",
            k8s_ldflags(),
            "-o",
            str(out / name),
            package,
            cwd=scratch,
        )
    go(
        "build",
        "-ldflags",
        "-s -w",
        "-o",
        str(out / "etcd"),
        "go.etcd.io/etcd/server/v3",
        cwd=scratch,
    )


def build_helm(out: Path) -> None:
    scratch = cache_root() / "src" / "helm"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "go.mod").write_text("module scalerl.dev/helmcli\n\ngo 1.26\n")
    go("get", f"helm.sh/helm/v4@{HELM}", cwd=scratch)
    flags = f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM}"
    go("build", "-ldflags", flags, "-o", str(out / "helm"), "helm.sh/helm/v4/cmd/helm", cwd=scratch)


def build_controller(name: str) -> None:
    """Controller `name` built in a writable copy of its released module."""
    module, version, package, tags = CONTROLLERS[name]
    scratch = cache_root() / "src" / "download"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "go.mod").write_text("module scalerl.dev/download\n\ngo 1.26\n")
    info = json.loads(go("mod", "download", "-json", f"{module}@{version}", cwd=scratch))
    source = controller_source(name)
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(info["Dir"], source)
    for path in (source, *source.rglob("*")):  # the module cache's files are read-only
        path.chmod(path.stat().st_mode | 0o200)
    flags = ["-tags", tags] if tags else []
    go(
        "build",
        "-p",
        "2",
        *flags,
        "-ldflags",
        "-s -w",
        "-o",
        str(controller_binary(name)),
        package,
        cwd=source,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what is missing")
    args = parser.parse_args(argv)
    absent = missing()
    if args.check or not absent:
        if absent:
            print(f"missing in {bin_dir()}: {', '.join(absent)}", file=sys.stderr)
            return 1
        print(bin_dir())
        return 0
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if set(absent) - {"helm", *CONTROLLERS}:
        build_kubernetes(out)
    if "helm" in absent:
        build_helm(out)
    for name in CONTROLLERS:
        if name in absent:
            build_controller(name)
    still = missing()
    if still:
        raise SystemExit(f"built, yet these do not answer their version: {', '.join(still)}")
    print(f"built in {time.monotonic() - started:.0f} s: {out}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
