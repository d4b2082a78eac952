#!/usr/bin/env bash
# The issue-47 table in one command: one-stream decode, inferlab against llama.cpp on the same weights (bf16
# and 4-bit, 1 and 2 threads), `inferlab bench decode` alternating its rounds with llama-bench's (-p 0 -n
# MAX_TOKENS per round; medians), the load average recorded before and after each cell, and the kernels each
# family ran (measured choice, or forced) from the bench JSON. Build llama.cpp first
# (scripts/build_llama_cpp.sh). Run it on a quiet machine: a load above 0.5 is flagged in the table.
#   scripts/decode_vs_llama_cpp.sh OUT_DIR [ROUNDS] [MAX_TOKENS]
set -euo pipefail
out=${1:?usage: decode_vs_llama_cpp.sh OUT_DIR [ROUNDS] [MAX_TOKENS]}; rounds=${2:-5}; tokens=${3:-128}
mkdir -p "$out"
for t in 1 2; do
  for b in bf16 int4; do
    cut -d' ' -f1 /proc/loadavg > "$out/load_before_t${t}_b${b}.txt"
    inferlab bench decode --threads "$t" --quant-format "$b" --rounds "$rounds" --max-tokens "$tokens" --no-baseline \
      --modes eager --json "$out/decode_t${t}_b${b}.json" > /dev/null
    cut -d' ' -f1 /proc/loadavg > "$out/load_after_t${t}_b${b}.txt"
  done
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| threads | weights | inferlab tok/s (rounds) | llama.cpp tok/s (rounds) | ratio | load before/after | kernels |")
print("| --- | --- | --- | --- | --- | --- | --- |")
cpu = None
for t in (1, 2):
    for b in ("bf16", "int4"):
        f = out / f"decode_t{t}_b{b}.json"
        if not f.exists():
            continue
        d = json.loads(f.read_text())
        c = d.get("cpu") or {}
        cpu = f"{c.get('model', '?')}, {c.get('logical_cpus', '?')} logical CPUs, {d.get('machine', '')}"
        ours = d["inferlab"]["decode_tokens_per_s"]
        each = d["inferlab_decode_tokens_per_s_each_round"]["eager"]
        ll = d.get("llama_cpp", {})
        theirs = ll.get("decode_tokens_per_s")
        ratio = ll.get("inferlab_over_llama_cpp", {}).get("eager")
        before = (out / f"load_before_t{t}_b{b}.txt").read_text().strip()
        after = (out / f"load_after_t{t}_b{b}.txt").read_text().strip()
        busy = " (busy)" if max(float(before), float(after)) > 0.5 else ""
        rounds = "/".join(f"{x:.0f}" for x in each)
        peer = "/".join(f"{x:.0f}" for x in ll.get("decode_tokens_per_s_each_round", []))
        print(f"| {t} | {b} | {ours:.1f} ({rounds}) | "
              f"{theirs if theirs is None else f'{theirs:.1f}'} ({peer}) | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} | {before}/{after}{busy} | {d['cpu_tier']} |")
print(f"\nCPU: {cpu}")
PY
