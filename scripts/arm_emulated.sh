#!/usr/bin/env bash
# An Arm (AArch64) Linux machine, emulated on an x86-64 one, for checking the engine's NEON path whole:
# Debian's arm64 Python, a CPU build of torch for aarch64 and the engine's other imports, run under
# qemu-aarch64-static. The native kernels build with the cross compiler (g++-aarch64-linux-gnu), driven
# from the emulated Python. Correctness only: qemu's speed says nothing of a real Arm CPU's.
#   scripts/arm_emulated.sh DIR              set it up in DIR (~1 GB; needs apt arm64 lists and pip)
#   QEMU_CPU=cortex-a76 DIR/python ARGS...   run Python there, from a checkout (QEMU_CPU: max, neoverse-n1,
#                                            cortex-a76, a64fx)
# torch 2.10.0 is the newest aarch64 wheel on PyPI built for the CPU alone (2.11 on are CUDA builds); it
# needs ARMv8.2 (it dies on a Cortex-A72 or A57: SIGILL in its own code).
set -euo pipefail
DIR=$(realpath -m "${1:?usage: scripts/arm_emulated.sh DIR}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
TORCH_ARM=${TORCH_ARM:-2.10.0}
mkdir -p "$DIR/debs" "$DIR/root" "$DIR/wheels"

# Debian's arm64 Python 3.11 (the version of this machine's, so its site packages' ABI tags match) and
# the libraries it and torch load, unpacked into a root qemu looks in first (-L); nothing is installed.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
apt-get update -qq
(cd "$DIR/debs" && apt-get download -qq -o APT::Sandbox::User=root python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
  libpython3.11-stdlib:arm64 libpython3.11-dev:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 \
  libbz2-1.0:arm64 liblzma5:arm64 libsqlite3-0:arm64 libgomp1:arm64 libstdc++6:arm64 libgcc-s1:arm64 libc6:arm64 \
  libuuid1:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libdb5.3:arm64 libnsl2:arm64 \
  libtirpc3:arm64 libcrypt1:arm64 libgssapi-krb5-2:arm64 libkrb5-3:arm64 libk5crypto3:arm64 \
  libkrb5support0:arm64 libcom-err2:arm64 libkeyutils1:arm64)
for deb in "$DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$DIR/root"; done

# torch for aarch64 (its wheel unpacked: pip refuses a foreign platform's wheel as a target) and the
# packages the engine imports, as aarch64 wheels.
"$PY" -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_aarch64 \
  --python-version 3.11 --implementation cp --abi cp311 -d "$DIR/wheels" "torch==$TORCH_ARM"
"$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
  "$DIR/wheels/torch-$TORCH_ARM-cp311-cp311-manylinux_2_28_aarch64.whl" "$DIR/site"
"$PY" -m pip install -q --upgrade --target "$DIR/site" --only-binary :all: --platform manylinux_2_28_aarch64 \
  --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 --python-version 3.11 --implementation cp \
  --abi cp311 --abi abi3 --abi none filelock typing_extensions sympy networkx jinja2 fsspec numpy safetensors \
  tokenizers tqdm packaging psutil nvidia-ml-py setuptools

# DIR/python: the emulated Python with the aarch64 packages, the cross compiler for the kernels (and the
# arm64 pyconfig.h), this machine's ninja, and a kernels cache of its own. The engine comes from the current
# folder or PYTHONPATH (run it from a checkout: cd REPO && QEMU_CPU=max DIR/python -m ...).
mkdir -p "$DIR/bin"
cp "$("$PY" -c "import ninja, os; print(os.path.join(ninja.BIN_DIR, 'ninja'))")" "$DIR/bin/ninja"  # an x86 binary
cat > "$DIR/python" <<WRAP
#!/bin/sh
export PYTHONPATH="$DIR/site\${PYTHONPATH:+:\$PYTHONPATH}" CXX=aarch64-linux-gnu-g++ \\
  CPLUS_INCLUDE_PATH="$DIR/root/usr/include" PATH="$DIR/bin:\$PATH" \\
  TORCH_EXTENSIONS_DIR="\${ARM_TORCH_EXTENSIONS_DIR:-$DIR/ext}"
exec qemu-aarch64-static -L "$DIR/root" "$DIR/root/usr/bin/python3.11" "\$@"
WRAP
chmod +x "$DIR/python"
QEMU_CPU=max "$DIR/python" -c "import platform, torch; print('aarch64 python ready:', platform.machine(), 'torch', torch.__version__)"
