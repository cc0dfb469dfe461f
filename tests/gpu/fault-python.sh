#!/bin/sh
# Summary: a test-only "torch interpreter" for make gpu-verify: counts its starts, then
# runs the real torch worker through fault_worker.py, which arranges a CUDA fault first.
#
# Usage: HEALTHCHECK_TORCH_PYTHON=tests/gpu/fault-python.sh GPU_VERIFY_FAULT=assert \
#          GPU_VERIFY_TORCH_PYTHON=python3 GPU_VERIFY_STARTS=FILE healthcheck ...
#
# GPU_VERIFY_FAULT: assert, illegal, hang or none (see fault_worker.py).
# GPU_VERIFY_TORCH_PYTHON: the interpreter that owns torch (default python3).
# GPU_VERIFY_STARTS: a file that gets one "start PID" line per start.
set -eu
if [ -n "${GPU_VERIFY_STARTS:-}" ]; then
  echo "start $$" >>"$GPU_VERIFY_STARTS"
fi
here=$(dirname "$0")
exec "${GPU_VERIFY_TORCH_PYTHON:-python3}" "$here/fault_worker.py" "$@"
