#!/usr/bin/env bash
# Runs the `--target ort-cuda` outputs of the bundled samples on onnxruntime's CUDA provider and
# compares them with the originals on the CPU. Skips, saying why, where CUDA does not load.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" scripts/check_cuda.py "$@"
