#!/usr/bin/env bash
# The few wheels scripts/gpu_check.sh installs on the lent GPU machine before it starts (that machine
# reaches no registry; its image lacks them), into .whl/ (git-ignored; name it in the device tool's
# carry). None is needed for a step to run: each lets more of the CPU suite run there instead of
# skipping (GGUF loading, the HTTP server, the data folders). PySide6 is not among them: its wheels are
# larger than the 64 MiB the device tool carries, so the screenshot step is skipped there.
#   scripts/gpu_wheels.sh            # then: run(carry=[".whl"], command="scripts/gpu_check.sh --out $OUT")
# Versions: the ones installed here (what the suite is tested with), else the newest; built for the
# image's CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
WHEELS=(platformdirs gguf fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn
        openai distro jiter sniffio)
specs=()
for name in "${WHEELS[@]}"; do
  version=$("$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
  specs+=("${name}${version:+==$version}")
done
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "${specs[@]}"
du -sh .whl
size=$(du -sm .whl | cut -f1)
if [ "$size" -ge 60 ]; then echo "gpu_wheels: .whl holds ${size} MiB, too close to the 64 MiB carry limit" >&2; exit 1; fi
