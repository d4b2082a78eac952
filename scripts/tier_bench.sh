#!/usr/bin/env bash
# The issue-24 figures in one go: one-stream decode (1 and 2 threads, int4 and bf16 weights) and batched decode
# (4 and 8 streams), inferlab against llama.cpp on the same weights, alternating rounds, on this CPU's
# best tier and on its AVX2 tier against an AVX2-only llama.cpp where one is built
# (LLAMA_ISA=avx2 scripts/build_llama_cpp.sh <cache>/llama.cpp-avx2), inferlab then run through
# scripts/as_avx2.sh (torch's own code capped at AVX2 too). Run it on a quiet machine.
#   scripts/tier_bench.sh OUT_DIR [ROUNDS]
set -euo pipefail
out=${1:?usage: tier_bench.sh OUT_DIR [ROUNDS]}; rounds=${2:-3}
mkdir -p "$out"
cache=${INFERLAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferlab}
uptime > "$out/load_before.txt"
for t in 1 2; do
  for b in int4 bf16; do
    inferlab bench decode --threads $t --quant-format $b --rounds "$rounds" --max-tokens 64 --no-baseline --modes eager \
      --tiers avx2 --json "$out/decode_native_t${t}_b${b}.json" > /dev/null
    if [[ -x "$cache/llama.cpp-avx2/bin/llama-bench" ]]; then
      INFERLAB_LLAMA_CPP_DIR="$cache/llama.cpp-avx2" "$(dirname "$0")/as_avx2.sh" inferlab bench decode --threads $t \
        --quant-format $b --rounds "$rounds" --max-tokens 64 --no-baseline --modes eager \
        --json "$out/decode_avx2_t${t}_b${b}.json" > /dev/null
    fi
  done
done
for b in int4 bf16; do
  inferlab bench batch --threads 2 --quant-format $b --streams 4 8 --rounds "$rounds" --json "$out/batch_native_b${b}.json" > /dev/null
done
uptime > "$out/load_after.txt"
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    d = json.loads(f.read_text())
    if d["benchmark"] == "decode":
        ll = d.get("llama_cpp", {})
        print(f"{f.name}: {d['cpu_tier']}, {d['threads']} thr, {d['quant_format']}: inferlab "
              f"{d['inferlab']['decode_tokens_per_s']:.1f} tok/s, llama.cpp {ll.get('decode_tokens_per_s', float('nan')):.1f}, "
              f"ratio {ll.get('inferlab_over_llama_cpp', {}).get('eager', float('nan')):.2f}"
              + (f"; tiers {json.dumps({k: round(v['decode_tokens_per_s'], 1) for k, v in d['tiers'].items()})}" if 'tiers' in d else ""))
    else:
        for n, row in d["streams"].items():
            print(f"{f.name}: {n} streams, {d['quant_format']}: inferlab {row['inferlab']['decode_tokens_per_s']:.1f}, "
                  f"llama.cpp {row.get('llama_cpp', {}).get('decode_tokens_per_s', float('nan')):.1f}, "
                  f"ratio {row.get('inferlab_over_llama_cpp', float('nan')):.2f}")
PY
