"""llama.cpp as the peer in the benches: one llama-bench run. Where its binaries are and the GGUF of the same
weights live in app/managed/gguf.py (the managed llama-server uses them too)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from app.managed.gguf import (
    BENCH,
    BUILD_KEYS,
    bf16_gguf,
    find_binary,
    gguf_for_format,
    llama_cpp_build,
    llama_cpp_dir,
    source_gguf,
)

__all__ = ["BENCH", "BUILD_KEYS", "bf16_gguf", "find_binary", "gguf_for_format", "llama_bench",
           "llama_cpp_build", "llama_cpp_dir", "source_gguf"]


def llama_bench(binary: Path, gguf: Path, threads: int, n_gen: int, n_prompt: int = 0,
                repetitions: int = 1, repack: bool = True) -> dict:
    """One llama-bench run (-o json): decode tokens/s for n_gen tokens (and prefill tokens/s for
    n_prompt tokens when > 0), with llama.cpp's own description of the build and the CPU.
    repack=False (--repack 0) keeps the weights in the file's layout (on a CPU with AMX, the sdist's llama.cpp
    built without scripts/build_llama_cpp.sh's patch segfaults in a Q4_1 prefill with repacked weights)."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-n", str(n_gen), "-p", str(n_prompt),
           "-r", str(repetitions), "--repack", "1" if repack else "0", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    rows = json.loads(proc.stdout)
    out: dict = {"command": " ".join(cmd)}
    for row in rows:
        kind = "decode" if row.get("n_gen", 0) > 0 else "prefill"
        out[f"{kind}_tokens_per_s"] = float(row["avg_ts"])
        out.setdefault("model_type", row.get("model_type"))
        out.setdefault("model_size_bytes", row.get("model_size"))
        out.setdefault("build_commit", row.get("build_commit"))
        out.setdefault("cpu_info", row.get("cpu_info"))
    return out
