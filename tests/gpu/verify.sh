#!/usr/bin/env bash
# Summary: prove every CUDA path of the health-check suite on this GPU machine, offline
#
# Usage: bash tests/gpu/verify.sh [--fake] [--out DIR]
#        make gpu-verify [FAKE=1] [OUT=DIR]
#        bash tests/gpu/verify.sh --help
#
# Installs the suite into a throw-away virtual environment that sees this machine's
# site-packages (python3 -m venv --system-site-packages, then pip install --no-deps
# --no-build-isolation --no-index: nothing is downloaded), then, with the Jupyter and
# SSH probes off (ENABLE_JUPYTER_CHECK=false ENABLE_SSH_CHECK=false):
#   0. a first torch-cuda run (the session's first CUDA context, timed)
#   1. the gpu-marked tests: pytest -m gpu
#   2. healthcheck in every profile (startup, readiness, liveness), text and --json:
#      each must pass (exit 0; status pass or warn)
#   3. real CUDA faults inside the torch worker through tests/gpu/fault-python.sh:
#      a device-side assert and an illegal memory access must give reason cuda-fatal
#      and latch; the latched run answers at once without a worker; liveness exits 1;
#      a fresh state dir clears it. Another process holding nearly all GPU memory gives
#      a warning; a worker killed at the deadline while a kernel runs gives reason
#      deadline and leaves no process behind
#   4. healthcheck serve (a free port, the NVML Xid watch on) for about 20 s: no
#      invented latch (/livez 200, healthcheck_latched 0), real metrics, clean SIGTERM
#   5. timings (medians): nvidia-smi, NVML init, torch-cuda cold and warm, liveness and
#      cached readiness against the python floor
# Every check is reported PASS, FAIL or SKIPPED with its reason; a failure never stops
# the others. result.json, summary.md and logs/ go to OUT (default bench/results/gpu,
# with --fake bench/results/gpu-fake); they are rewritten after every check.
#
# --fake (FAKE=1): a self-test without a GPU, so this script cannot rot: the fake
# libnvidia-ml.so.1 (tests/fakes), a stub nvidia-smi, torch on the CPU from .venv
# (make setup). Faults are simulated on the CPU; checks that need real CUDA print
# "skipped: needs a real GPU".
#
# Never changes a GPU setting (no persistence or compute mode, clocks, MIG or reset
# commands), never downloads anything, talks only to the local serve it starts.
#
# Environment: GPU_VERIFY_PYTHON (the interpreter that owns torch; default python3,
# with --fake .venv/bin/python), GPU_VERIFY_BUDGET (seconds after which the remaining
# checks are skipped so that the summary is written in time; default 420),
# GPU_VERIFY_RUNS (runs per timing; default 5, with --fake 3), GPU_VERIFY_COMMIT (the
# commit to record where the copy has no .git), KEEP=1 (keep the work directory).
#
# Exit status: 0 every check that could run passed, 1 a check failed, 3 usage error.
set -euo pipefail

abort() {
  echo "gpu-verify: $*" >&2
  exit 3
}

usage() {
  sed -n '2,/^[^#]/{/^#/!d;s/^# \{0,1\}//;p}' "$self"
}

self=$(readlink -f "${BASH_SOURCE[0]}")
here=${self%/*}
root=$(cd "$here/../.." && pwd)

fake=${FAKE:-}
out=${OUT:-}
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help | help)
      usage
      exit 0
      ;;
    --fake) fake=1 ;;
    --out)
      [ $# -ge 2 ] || abort "--out needs a directory"
      out=$2
      shift
      ;;
    --out=*) out=${1#--out=} ;;
    *) abort "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
case ${fake,,} in
  1 | true | yes | on) fake=1 ;;
  '' | 0 | false | no | off) fake= ;;
  *) abort "FAKE='$fake' is not accepted (1 for the self-test, empty for a real GPU)" ;;
esac

cd "$root"
if [ -n "$fake" ]; then
  out=${out:-bench/results/gpu-fake}
  python=${GPU_VERIFY_PYTHON:-$root/.venv/bin/python}
  [ -x "$python" ] || abort "no $python: run 'make setup' first (the self-test uses its CPU torch)"
  if [ ! -f tests/fakes/build/libnvidia-ml.so.1 ]; then
    make -s -C tests/fakes >/dev/null || abort "cannot build the fake NVML library (make -C tests/fakes)"
  fi
else
  out=${out:-bench/results/gpu}
  python=${GPU_VERIFY_PYTHON:-$(command -v python3 || true)}
  [ -n "$python" ] && [ -x "$python" ] || abort "no python3 on PATH: set GPU_VERIFY_PYTHON to the interpreter that owns torch"
fi
mkdir -p "$out/logs" || abort "cannot create $out"
out=$(cd "$out" && pwd)
rm -f "$out/result.json" "$out/summary.md" "$out"/logs/*.log

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-verify.XXXXXX")
# shellcheck disable=SC2329 # run by the trap
cleanup() {
  if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "gpu-verify: work directory kept: $work"; fi
}
trap cleanup EXIT
venv=$work/venv

# The suite's own environment, as an image would build it: a virtual environment that
# sees the site-packages of the interpreter that owns torch, the suite installed from a
# copy of the sources (the build leaves nothing in the work tree), nothing downloaded.
# That interpreter's own site-packages are linked in by a .pth file: where it is
# itself a virtual environment (.venv in the self-test) --system-site-packages alone
# would see only its base interpreter's.
site_dirs='import os, site
user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
print("\n".join(d for d in site.getsitepackages() + user if os.path.isdir(d)))'
install_suite() {
  local base site
  base=$("$python" -c 'import sys; print(getattr(sys, "_base_executable", "") or sys.executable)')
  echo "base interpreter: $base"
  "$base" -m venv --system-site-packages --without-pip "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$python" -c "$site_dirs" >"$site/gpu-verify-site.pth"
  mkdir "$work/src"
  cp -R pyproject.toml README.md healthcheck probes "$work/src/"  # healthcheck: the package installs it
  # pip from the machine's site-packages, running in the new environment: installs there.
  "$venv/bin/python" -m pip install --no-deps --no-build-isolation --no-index --ignore-installed \
    --no-input --disable-pip-version-check "$work/src"
  "$venv/bin/python" -I -c 'import probes, psutil, pynvml, prometheus_client; print("suite:", probes.__file__)'
}

# The install step's result for the summary: JSON with status, detail and seconds.
install_result() {
  "$python" -c 'import json, sys; print(json.dumps(dict(zip(("status", "detail", "seconds"), sys.argv[1:]))))' \
    "$@" >"$work/install.json"
}

echo "gpu-verify: installing the suite into $venv (offline)"
started=$SECONDS
if install_suite >"$out/logs/000-install.log" 2>&1; then
  install_result PASS "pip install --no-deps --no-build-isolation --no-index into a --system-site-packages venv from $python" $((SECONDS - started))
else
  # Keep going from the source tree, so the GPU checks still run; the failure is reported.
  why=$(grep -v '^ *$' "$out/logs/000-install.log" | tail -n 3 | tr '\n' ' ' | cut -c1-300)
  install_result FAIL "the install failed (logs/000-install.log): $why; the checks use the source tree instead" $((SECONDS - started))
  if [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    "$python" -m venv --system-site-packages --without-pip "$venv" || abort "cannot create a virtual environment with $python"
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$python" -c "$site_dirs" >"$site/gpu-verify-site.pth"
  echo "$root" >>"$site/gpu-verify-site.pth"
fi

status=0
"$venv/bin/python" "$here/verify.py" --out "$out" --work "$work" --suite-python "$venv/bin/python" \
  --torch-python "$python" --install "$work/install.json" ${fake:+--fake} || status=$?
if [ "$status" -gt 1 ] || [ ! -s "$out/summary.md" ]; then
  # The checks themselves crashed: still leave a summary behind.
  {
    echo "# gpu-verify: FAIL (the checks stopped with exit status $status)"
    echo
    echo "See logs/ beside this file; the last lines of the install log:"
    echo
    tail -n 5 "$out/logs/000-install.log" | sed 's/^/    /'
  } >>"$out/summary.md"
  echo "gpu-verify: the checks stopped with exit status $status; see $out/summary.md" >&2
  exit 1
fi
exit "$status"
