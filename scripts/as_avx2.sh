#!/bin/sh
# Run a command on this CPU as an AVX2-only CPU would run it (no AVX-512, no native bf16 dot products):
# inferlab's AVX2 kernels, its bf16 emulated, and torch's own code capped at AVX2 too (ATen's kernels,
# inductor's generated code, oneDNN's and MKL's products: uncapped, oneDNN's bf16 GEMM ran on AMX here at
# ~570 GFLOP/s, 30x what it does capped). The nearest thing to an AVX2 machine on an AVX-512 one, not one:
# caches, memory bandwidth and clocks stay this CPU's.
#   scripts/as_avx2.sh inferlab prepare --json prepared-avx2.json
#   scripts/as_avx2.sh python -m pytest -q
export INFERLAB_CPU_TIER=avx2 INFERLAB_EMULATED_BF16=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
  MKL_ENABLE_INSTRUCTIONS=AVX2
exec "$@"
