#!/bin/sh
# Summary: a test-only "torch interpreter": runs the real torch worker through sample_worker.py,
# which makes CUDA look available in the CPU torch and raises the corpus sample CORPUS_SAMPLE.
#
# Usage: HEALTHCHECK_TORCH_PYTHON=tests/corpus/sample-python.sh CORPUS_SAMPLE=FILE \
#          CORPUS_TORCH_PYTHON=.venv/bin/python healthcheck --only torch-cuda
set -eu
here=$(dirname "$0")
exec "${CORPUS_TORCH_PYTHON:-python3}" "$here/sample_worker.py" "$@"
