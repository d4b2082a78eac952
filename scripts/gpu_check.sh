#!/usr/bin/env bash
# One prepared run on a GPU machine: environment, cuda tests, benches (1 and 64 streams, vs HF on the
# same GPU, achieved bandwidth vs a measured copy), a screenshot of the app, the CPU suite with CUDA
# hidden; JSON, XML and PNG results in one folder, within 10 minutes. See scripts/gpu_check.py.
#   scripts/gpu_check.sh --out "$OUT"          # on the GPU machine
#   scripts/gpu_check.sh --dry-run --out /tmp/gc   # the same steps on the CPU (tests/test_gpu_check.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
exec "$PY" scripts/gpu_check.py "$@"
