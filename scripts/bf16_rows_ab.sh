#!/usr/bin/env bash
# The bf16 body at a git revision (A) against the working tree's (B), alternating, on all of SmolLM2-135M's
# matrices (scripts/bf16_rows_ab.cpp). Usage: scripts/bf16_rows_ab.sh REV [SWEEPS]
#   CXXFLAGS picks the tier: "-mavx2 -mfma -mf16c" (the default: the AVX2 body) or "-march=native".
#   AB_SRC=int4_rows_ab.cpp: the int4 x int8-activation body instead (1-4 rows).
# Ratios from one run only (the machine's speed drifts); quiet machine, say its load.
set -euo pipefail
rev=${1:?usage: $0 REV [SWEEPS]}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$rev" engine/kernels/core | tar -x -C "$tmp"
flags=(-O3 -std=c++17 ${CXXFLAGS:--mavx2 -mfma -mf16c})
src="$root/scripts/${AB_SRC:-bf16_rows_ab.cpp}"
g++ "${flags[@]}" -DFN=rows_a -I "$tmp/engine/kernels" -c "$src" -o "$tmp/a.o"
g++ "${flags[@]}" -DFN=rows_b -I "$root/engine/kernels" -c "$src" -o "$tmp/b.o"
g++ "${flags[@]}" -DMAIN "$src" "$tmp/a.o" "$tmp/b.o" -o "$tmp/ab"
echo "A: $rev   B: working tree   flags: ${flags[*]}   $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$tmp/ab" "${2:-15}"
