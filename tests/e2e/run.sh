#!/usr/bin/env bash
# Summary: the end-to-end tests on a real Docker engine (make e2e)
# Usage: bash tests/e2e/run.sh [--build-only | PYTEST ARGS...]
#
# 1. makes a Docker Engine 25+ answer (installs and starts one as root when none does),
# 2. builds the local CPU base image once (debootstrap + the CPU torch wheel; cached),
# 3. builds the product Dockerfile on that base (unchanged; Docker's layer cache keeps it quick),
# 4. runs `pytest -m e2e tests/e2e` on two workers, a test file each at a time: most of a test is
#    waiting for a container's health to change, and a file's shared containers stay on one worker.
# --build-only (make e2e-image) stops after step 3: CI runs it while nothing timing-sensitive runs,
# and make e2e then finds everything built.
# E2E_IMAGE names the tag to build and test (default gpu-dev:e2e).
set -euo pipefail
[ -n "${E2E_DEBUG:-}" ] && set -x

abort() {
  echo "run.sh: $*" >&2
  exit 1
}

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
PY="${E2E_PYTHON:-$ROOT/.venv/bin/python}"
[ "${1:-}" = --build-only ] || [ -x "$PY" ] || abort "$PY not found: run make setup first"
IMAGE="${E2E_IMAGE:-gpu-dev:e2e}"
mkdir -p .e2e

stamp() {
  date +%s
}

t0=$(stamp)
bash "$HERE/engine.sh"
t1=$(stamp)
base="$(bash "$HERE/base-image.sh")"
t2=$(stamp)
echo "run.sh: building $IMAGE on $base" >&2
docker build --network host --build-arg "BASE_IMAGE=$base" -t "$IMAGE" . >.e2e/build.log 2>&1 \
  || { tail -n 30 .e2e/build.log >&2; abort "docker build failed: see .e2e/build.log"; }
t3=$(stamp)
echo "run.sh: engine $((t1 - t0))s, base image $((t2 - t1))s, image $((t3 - t2))s" >&2
[ "${1:-}" != --build-only ] || exit 0

status=0
E2E_IMAGE="$IMAGE" E2E_REQUIRE_ENGINE=1 "$PY" -m pytest -n 2 --dist loadfile --durations=10 -m e2e \
  -p no:cacheprovider "$@" tests/e2e || status=$?
t4=$(stamp)
echo "run.sh: tests $((t4 - t3))s, total $((t4 - t0))s" >&2
exit "$status"
