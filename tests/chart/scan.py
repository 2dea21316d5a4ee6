"""The policy scan of `make lint`: checkov's Kubernetes checks over the chart as Helm renders it.

    python tests/chart/scan.py      # exit 0: no finding but the documented skips below

The chart is rendered by the real Helm engine (helm-python-sdk, in the project's venv: no helm
binary needed, so lint runs before the control plane is built) with its default values, the
Prometheus Operator's objects on, and an image digest, as a release pins it (CKV_K8S_43 then
checks that the template runs the image by digest; the chart's default names no digest, since
no digest is known when it is packaged). checkov runs from a venv of its own, built from
checkov-requirements.txt's exact pins and cached under ~/.cache/scalerl by the hash of that file
and the Python version (tests/pinned_venv.py, as trackio's is built). It runs offline
(--skip-download): no policy or guideline is fetched from Prisma Cloud.

Every finding fails lint, but those in SKIPS, each with the reason it stays. Cost: about 4 s
warm (checkov's start and 100-odd checks); cold, building the venv about 35 s more here
(downloads included; it holds ~400 MB).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import pinned_venv  # noqa: E402
from helmchart import render_files  # noqa: E402

REQUIREMENTS = HERE / "checkov-requirements.txt"
# What a release pins (any well-formed digest: the scan reads the manifest, pulls nothing).
DIGEST = "sha256:" + "0" * 64

# The checks that fail and stay failed, with why. A new finding fails lint until it is fixed
# or added here with its reason.
SKIPS = {
    "CKV_K8S_38": "Service Account Tokens mounted only where necessary: the operator's pod is "
    "where it is necessary; it watches and writes runs and their children through the API "
    "server with its ServiceAccount's token.",
    "CKV_K8S_15": "Image Pull Policy should be Always: image.pullPolicy is the user's "
    "(IfNotPresent by default); with image.digest the image cannot change under a tag, so "
    "Always would only add a registry round trip to every start and fail starts while the "
    "registry is down.",
}


def checkov() -> list[str]:
    """The command of the cached venv's checkov, the venv built first when missing (its
    interpreter runs the script: the script's own first line names the folder it was built in)."""
    venv = pinned_venv.build("checkov", REQUIREMENTS)
    return [str(venv / "bin" / "python"), str(venv / "bin" / "checkov")]


def render(into: Path) -> None:
    """The chart's manifests, one file per template (NOTES.txt aside)."""
    for path, text in render_files({"image": {"digest": DIGEST}}).items():
        if path.endswith(".txt") or not text.strip():
            continue
        (into / path.replace("/", "_")).write_text(text)


def main() -> int:
    scan = checkov()
    with tempfile.TemporaryDirectory(prefix="scalerl-chart-") as folder:
        render(Path(folder))
        command = [*scan, "--directory", folder, "--framework", "kubernetes"]
        command += ["--skip-download", "--compact", "--quiet"]
        command += ["--skip-check", ",".join(sorted(SKIPS))]
        done = subprocess.run(command, check=False)
    if done.returncode != 0:
        print(
            "the chart's policy scan failed: fix the finding, or add it to SKIPS in "
            "tests/chart/scan.py with the reason it stays",
            file=sys.stderr,
        )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
