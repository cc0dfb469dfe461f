#!/usr/bin/env bash
# Summary: build (once) the local CPU base image the end-to-end tests use instead of pytorch/pytorch
# Usage: bash tests/e2e/base-image.sh [TAG]
#
# No image can be pulled here, so the base is built from nothing: `debootstrap --variant=minbase
# bookworm` imported with `docker import`, then tests/e2e/base/Dockerfile adds python3 and the CPU
# torch wheel from this machine's disk. Both images are cached: each is rebuilt only when missing
# (E2E_REBUILD_BASE=1 forces it; the tag changes with tests/e2e/base/Dockerfile). Prints the tag.
set -euo pipefail
[ -n "${E2E_DEBUG:-}" ] && set -x

abort() {
  echo "base-image.sh: $*" >&2
  exit 1
}

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# The tag carries a hash of the base Dockerfile, so editing it rebuilds the base.
TAG="${1:-${E2E_BASE_IMAGE:-gpu-dev-e2e/base:bookworm-cpu-$(sha256sum "$HERE/base/Dockerfile" | cut -c1-12)}}"
MINBASE="${E2E_MINBASE_IMAGE:-gpu-dev-e2e/bookworm-minbase:latest}"
# The Debian mirror this machine's own apt sources use (no host is written here).
MIRROR="${E2E_DEBIAN_MIRROR:-$(bash "$HERE/debian-mirror.sh")}"
TORCH_SPEC="${E2E_TORCH_SPEC:-torch==2.13.0}"
WORK="${E2E_WORK_DIR:-$ROOT/.e2e}"
# Only pip is needed of it: before make setup has made .venv (CI builds beside it), the python3 on PATH.
PY="${E2E_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || [ -n "${E2E_PYTHON:-}" ] || PY=python3
CA_BUNDLE="${E2E_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

have_image() {
  docker image inspect "$1" >/dev/null 2>&1
}

if [ -n "${E2E_REBUILD_BASE:-}" ]; then
  docker image rm -f "$TAG" "$MINBASE" >/dev/null 2>&1 || true
fi

if have_image "$TAG"; then
  echo "$TAG"
  exit 0
fi

if ! have_image "$MINBASE"; then
  [ "$(id -u)" -eq 0 ] || abort "debootstrap needs root: run as root or set E2E_BASE_IMAGE to an existing image"
  if ! command -v debootstrap >/dev/null; then
    echo "base-image.sh: installing debootstrap" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends debootstrap >/dev/null \
      || { apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y \
        --no-install-recommends debootstrap >/dev/null; } \
      || abort "cannot install debootstrap: apt-get install debootstrap"
  fi
  rootfs="$WORK/rootfs"
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  echo "base-image.sh: debootstrap --variant=minbase bookworm (about 30 s)" >&2
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log" >&2; abort "debootstrap failed: see $WORK/debootstrap.log"; }
  # Smaller image, and no package lists baked in (every build runs apt-get update anyway).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$MINBASE" >/dev/null
  rm -rf "$rootfs"
fi

ctx="$WORK/base-context"
rm -rf "$ctx"
mkdir -p "$ctx/wheels"
cp "$HERE/base/Dockerfile" "$ctx/Dockerfile"
[ -r "$CA_BUNDLE" ] || abort "CA bundle $CA_BUNDLE not readable: set E2E_CA_BUNDLE"
cp "$CA_BUNDLE" "$ctx/ca-certificates.crt"
command -v "$PY" >/dev/null || abort "$PY not found: run make setup first (or set E2E_PYTHON)"
echo "base-image.sh: fetching the $TORCH_SPEC wheel from this machine's pip sources" >&2
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$ctx/wheels" "$TORCH_SPEC" \
  || abort "pip download $TORCH_SPEC failed: the CPU wheel must be reachable by pip on this machine"
echo "base-image.sh: building $TAG" >&2
docker build -q --network host --build-arg "MINBASE=$MINBASE" -t "$TAG" "$ctx" >/dev/null \
  || abort "building $TAG failed: rerun with E2E_DEBUG=1"
rm -rf "$ctx"
echo "$TAG"
