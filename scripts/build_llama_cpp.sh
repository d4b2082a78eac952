#!/usr/bin/env bash
# Build llama.cpp's command-line tools (llama-bench, llama-batched-bench, llama-server, llama-cli,
# llama-perplexity, llama-quantize) from the llama.cpp source that ships inside the llama-cpp-python sdist.
# Why the sdist: pip can reach PyPI here while GitHub cannot be cloned, and the sdist vendors a
# complete llama.cpp tree (vendor/llama.cpp) at a pinned commit.
#
#   scripts/build_llama_cpp.sh [OUT_DIR]     # default: $XDG_CACHE_HOME/inferlab/llama.cpp
#
# Idempotent: a finished build (OUT_DIR/bin/llama-bench and llama-server present and runnable) is
# left alone; an unpacked source or a half-done build directory is reused. Environment knobs:
#   LLAMA_CPP_PYTHON_VERSION  pin the sdist (default: the newest on the index)
#   JOBS                      parallel compile jobs (default 2)
#   FORCE=1                   rebuild even if the binaries exist
#   LLAMA_TARGETS="a b"       build only these tools (default: all six above; CI builds llama-server,
#                             llama-quantize and llama-bench, what the tests run)
#   LLAMA_ISA=avx2            build for AVX2 + FMA + F16C only (GGML_NATIVE off, no AVX-512), to compare
#                             with inferlab's avx2 tier on a CPU that has AVX-512 (default: native)
#   LLAMA_OPT=O1              compile at -O1 instead of -O3: ~40% less compile time, slower binaries; for
#                             tests that run the tools, never for figures (VERSION says "opt: O1"; CI)
# Afterwards: OUT_DIR/bin/{llama-bench,llama-server,...}, OUT_DIR/src (the llama.cpp tree, with
# convert_hf_to_gguf.py), OUT_DIR/VERSION (sdist version, ISA, the patch applied).
#
# One patch (scripts/patch_llama_cpp.py), so that the peer runs its best path on Intel CPUs with AMX: GCC 12
# drops the stores of ggml's AMX tile configuration, and the first AMX product dies of SIGSEGV (llama.cpp
# issue 20824). The patch adds a compiler barrier, nothing else. A finished build whose source still needs
# it is patched and rebuilt (only that file recompiles).
set -euo pipefail

OUT_DIR="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/inferlab/llama.cpp}"
JOBS="${JOBS:-2}"
read -r -a TARGETS <<< "${LLAMA_TARGETS:-llama-bench llama-batched-bench llama-server llama-cli llama-perplexity llama-quantize}"
# (always given: CMake keeps a cache variable, and a build folder made at -O1 would stay at -O1 when -O3 is asked)
case "${LLAMA_OPT:-O3}" in
  O3|O1) OPT_FLAGS=(-DCMAKE_C_FLAGS_RELEASE="-${LLAMA_OPT:-O3} -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-${LLAMA_OPT:-O3} -DNDEBUG") ;;
  *) echo "error: LLAMA_OPT must be O3 or O1" >&2; exit 2 ;;
esac
ISA_FLAGS=()
case "${LLAMA_ISA:-native}" in
  native) ;;
  avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF) ;;
  *) echo "error: LLAMA_ISA must be native or avx2" >&2; exit 2 ;;
esac
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

# patch_amx_tile_config SRC: scripts/patch_llama_cpp.py (see its docstring); prints patched, kept or absent.
patch_amx_tile_config() { python3 "$(dirname "${BASH_SOURCE[0]}")/patch_llama_cpp.py" "$1"; }

# all_built: every target asked for is in OUT_DIR/bin and runs (--help exits 0, or 1 for llama-quantize:
# not 126/127, nor a signal such as SIGILL from a build for another CPU)
all_built() {
  local t rc
  for t in "${TARGETS[@]}"; do
    [[ -x "$OUT_DIR/bin/$t" ]] || return 1
    rc=0; "$OUT_DIR/bin/$t" --help >/dev/null 2>&1 || rc=$?
    [[ $rc -le 1 ]] || return 1
  done
}

# opt_matches: the build in OUT_DIR was made at the LLAMA_OPT asked for (a VERSION without "opt:" is -O3)
opt_matches() {
  local have
  have="$(sed -n 's/^opt: //p' "$OUT_DIR/VERSION" 2>/dev/null)"
  [[ "${have:-O3}" == "${LLAMA_OPT:-O3}" ]]
}

if [[ "${FORCE:-0}" != 1 ]] && all_built && opt_matches; then
  if [[ ! -f "$OUT_DIR/src/CMakeLists.txt" || "$(patch_amx_tile_config "$OUT_DIR/src")" != patched ]]; then
    echo "llama.cpp already built in $OUT_DIR/bin"
    exit 0
  fi
  echo "llama.cpp in $OUT_DIR: AMX tile configuration patched; rebuilding"
fi

for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' is needed to build llama.cpp" >&2; exit 2; }
done

# 1. the sdist (skipped when already downloaded)
SDIST_DIR="$OUT_DIR/sdist"
mkdir -p "$SDIST_DIR"
if ! ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  spec="llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}"
  python3 -m pip download --no-deps --no-binary :all: "$spec" -d "$SDIST_DIR"
fi
SDIST="$(ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"

# 2. unpack only vendor/llama.cpp into OUT_DIR/src (skipped when already there)
SRC="$OUT_DIR/src"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  tmp="$(mktemp -d "$OUT_DIR/unpack.XXXXXX")"
  tar -xzf "$SDIST" -C "$tmp"
  top="$(ls "$tmp")"
  rm -rf "$SRC"
  mv "$tmp/$top/vendor/llama.cpp" "$SRC"
  rm -rf "$tmp"
fi
PATCH="$(patch_amx_tile_config "$SRC")"

# 3. configure + build. GGML_NATIVE (default ON) compiles for this CPU's ISA (-march=native), which
# is what a user building llama.cpp locally gets. No web UI: the build would fetch it from the Hugging
# Face Hub (LLAMA_USE_PREBUILT_UI), and the server's API is all inferlab uses.
BUILD="$OUT_DIR/build"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF "${OPT_FLAGS[@]}" "${ISA_FLAGS[@]}" >/dev/null
available=()
for t in "${TARGETS[@]}"; do
  if cmake --build "$BUILD" --target help 2>/dev/null | grep -q " $t\$\| $t:"; then available+=("$t"); fi
done
[[ ${#available[@]} -gt 0 ]] || available=("${TARGETS[@]}")
cmake --build "$BUILD" --config Release -j "$JOBS" --target "${available[@]}"

# 4. collect the binaries
mkdir -p "$OUT_DIR/bin"
for t in "${available[@]}"; do
  if [[ -x "$BUILD/bin/$t" ]]; then cp -f "$BUILD/bin/$t" "$OUT_DIR/bin/$t"; fi
done
{
  echo "sdist: $(basename "$SDIST")"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(c++ --version | head -n 1)"
  echo "isa: ${LLAMA_ISA:-native}"
  echo "opt: ${LLAMA_OPT:-O3}"
  case "$PATCH" in
    patched|kept) echo "patch: amx-tile-config (a compiler barrier so the AMX tile configuration is stored; llama.cpp issue 20824)" ;;
    *) echo "patch: none (no AMX tile configuration code in this tree)" ;;
  esac
} > "$OUT_DIR/VERSION"
for t in "${TARGETS[@]}"; do
  [[ -x "$OUT_DIR/bin/$t" ]] || { echo "error: $t was not built" >&2; exit 1; }
done
echo "llama.cpp binaries in $OUT_DIR/bin: $(ls "$OUT_DIR/bin" | tr '\n' ' ')"
