#!/usr/bin/env bash
# One prepared run on a GPU machine: environment, cuda tests, benches (1 and 64 streams, vs HF on the
# same GPU, achieved bandwidth vs a measured copy), a screenshot of the app, the CPU suite with CUDA
# hidden; JSON, XML and PNG results in one folder, within 10 minutes. See scripts/gpu_check.py.
#   scripts/gpu_check.sh --out "$OUT"          # on the GPU machine
#   scripts/gpu_check.sh --dry-run --out /tmp/gc   # the same steps on the CPU (tests/test_gpu_check.py)
#   scripts/gpu_wheels.sh    # here, first (optional): wheels for .whl/, carried and installed by this script
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
# Wheels scripts/gpu_wheels.sh fetched, where they were carried: installed beside the image's packages
# (never over them: --target), for this run only.
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=$(mktemp -d -t gpu-check-site-XXXXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "gpu_check: the carried wheels did not install; running without them" >&2
fi
exec "$PY" scripts/gpu_check.py "$@"
