#!/usr/bin/env bash
# A local base image for the operator's Dockerfile where python:3.11-slim-bookworm cannot be
# pulled: Debian bookworm made with mmdebstrap (Debian's own tool) from Debian's mirror, holding
# Python 3.11, pip, venv and the CA certificates, imported into Podman's image store.
#   images/base-image.sh [TAG]        (`make base-image`; TAG defaults to localhost/scalerl/base:bookworm)
# Cached twice: the tarball under ~/.cache/scalerl/images (kept across Podman resets) and the image
# in Podman's store; each step is skipped when its result is already there.
set -euo pipefail
tag="${1:-localhost/scalerl/base:bookworm}"
cache="${SCALERL_CACHE:-$HOME/.cache/scalerl}/images"
tarball="$cache/base-bookworm.tar"
if ! command -v podman >/dev/null; then
  echo "base-image: podman is not installed (apt-get install podman buildah mmdebstrap)" >&2
  exit 1
fi
if podman image exists "$tag"; then
  echo "base-image: $tag is already in Podman's store"
  exit 0
fi
if [ ! -s "$tarball" ]; then
  command -v mmdebstrap >/dev/null \
    || { echo "base-image: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2; exit 1; }
  mkdir -p "$cache"
  # minbase: Essential and Priority:required packages (passwd's useradd included) plus apt; no
  # Recommends (python3-pip would pull a compiler). The apt lists are dropped: the image never
  # runs apt, and they are 40 MB.
  mmdebstrap --variant=minbase --aptopt='APT::Install-Recommends "false"' \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    --format=tar --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tarball.part"
  mv "$tarball.part" "$tarball"
fi
podman import --change 'CMD ["python3"]' "$tarball" "$tag" >/dev/null
echo "base-image: $tag imported from $tarball"
