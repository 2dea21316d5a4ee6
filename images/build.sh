#!/usr/bin/env bash
# `make images`: the operator's image (it also runs the fit Job), the generator's and the trainer's,
# tagged scalerl/NAME:VERSION (pyproject.toml's version, as the chart and the operator name them).
#
# With Docker where `docker info` answers, else with Podman (`podman build --isolation chroot`:
# no daemon, and it works inside a container), else it says so in one line and builds nothing.
# BASE (environment or `make images BASE=...`): the operator image's base, for hosts that cannot
# pull python:3.11-slim-bookworm (`make base-image` makes localhost/scalerl/base:bookworm).
# The generator's and trainer's CUDA bases are pulled first; where that fails, one line says so
# and the operator's image is still built. IMAGES: which to build (default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)

if docker info >/dev/null 2>&1; then
  engine=(docker)
  build=(docker build)
elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then
  engine=(podman)
  build=(podman build --isolation chroot)
  # A TLS-inspecting proxy between the build and PyPI: give pip this host's CA bundle.
  ca=/etc/ssl/certs/ca-certificates.crt
  if [ -s "$ca" ]; then
    build+=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  fi
else
  echo "images: neither Docker (docker info) nor Podman (podman info) answers, nothing was built"
  exit 0
fi

# The base of a Dockerfile's final stage, fully qualified for Podman (which resolves Docker Hub's
# short names only through its alias list).
base_of() {
  local base
  base=$(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$1" | tail -n 1)
  case "${base%%/*}" in
    *.*|*:*|localhost) echo "$base" ;;
    *) if [ "${base#*/}" = "$base" ]; then echo "docker.io/library/$base"; else echo "docker.io/$base"; fi ;;
  esac
}

images=" ${IMAGES:-operator generator trainer} "
if [[ "$images" == *" operator "* ]]; then
  operator_args=()
  [ -n "${BASE:-}" ] && operator_args=(--build-arg "BASE=$BASE")
  "${build[@]}" "${operator_args[@]}" -f operator/Dockerfile -t "scalerl/operator:$version" .
fi

for name in generator trainer; do
  [[ "$images" == *" $name "* ]] || continue
  dockerfile="images/$name/Dockerfile"
  base=$(base_of "$dockerfile")
  if ! "${engine[@]}" image inspect "$base" >/dev/null 2>&1 \
    && ! "${engine[@]}" pull -q "$base" >/dev/null 2>&1; then
    echo "images: scalerl/$name:$version not built: its base $base cannot be pulled here"
    continue
  fi
  "${build[@]}" -f "$dockerfile" -t "scalerl/$name:$version" .
done
