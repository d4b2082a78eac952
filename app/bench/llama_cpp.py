"""llama.cpp as the peer in the benches: where its binaries are, the GGUF of the same weights, one run.

The binaries come from scripts/build_llama_cpp.sh (llama.cpp built from the source in the
llama-cpp-python sdist); their folder is INFERLAB_LLAMA_CPP_DIR, else the script's default
(<inferlab cache>/llama.cpp). Nothing here runs when they are absent: the benches then say so.

Same weights: the bf16 GGUF is written by llama.cpp's own convert_hf_to_gguf.py from the folder the
engine loaded (for the default model: the wheel's Q4_1 GGUF dequantized to bf16, the weights the bf16
engine holds); at 4 bits the peer runs the GGUF the engine's weights came from, when there is one.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from engine.loading.loader import cache_root

BENCH = "llama-bench"


def llama_cpp_dir() -> Path:
    override = os.environ.get("INFERLAB_LLAMA_CPP_DIR")
    return Path(override).expanduser() if override else cache_root() / "llama.cpp"


def find_binary(name: str = BENCH, directory: Path | None = None) -> Path | None:
    """The built binary `name`, or None when it is not there (or cannot run)."""
    path = (directory or llama_cpp_dir()) / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def source_gguf(model_path: str) -> Path | None:
    """The GGUF the engine's folder was converted from (engine/loading/gguf_convert.py records it)."""
    record = Path(model_path) / "inferlab_conversion.json"
    try:
        source = Path(json.loads(record.read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def bf16_gguf(model_path: str, directory: Path | None = None) -> Path:
    """A bf16 GGUF of the HF folder `model_path`, written once by llama.cpp's convert_hf_to_gguf.py
    (kept under <llama.cpp dir>/models, named by a hash of the folder's weights)."""
    directory = directory or llama_cpp_dir()
    weights = sorted(Path(model_path).glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{model_path}: no safetensors to convert to GGUF")
    digest = hashlib.sha256()
    for w in weights:
        digest.update(f"{w.name}:{w.stat().st_size}:{int(w.stat().st_mtime)}".encode())
    out = directory / "models" / f"{Path(model_path).name}-{digest.hexdigest()[:12]}.bf16.gguf"
    if out.is_file():
        return out
    script = directory / "src" / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ValueError(f"{script} is missing: run scripts/build_llama_cpp.sh {directory}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    proc = subprocess.run([sys.executable, str(script), str(model_path), "--outtype", "bf16", "--outfile", str(tmp)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"convert_hf_to_gguf.py failed: {proc.stderr.strip().splitlines()[-1:]}")
    tmp.rename(out)
    return out


def gguf_for(model_path: str, bits: int, directory: Path | None = None) -> Path | None:
    """The GGUF llama.cpp runs against the engine at `bits`: bf16 for 16, the source GGUF for 4 (None
    when the model did not come from one: there is no same-weights 4-bit file to compare with)."""
    if bits == 16:
        return bf16_gguf(model_path, directory)
    return source_gguf(model_path) if bits == 4 else None


def llama_bench(binary: Path, gguf: Path, threads: int, n_gen: int, n_prompt: int = 0,
                repetitions: int = 1, repack: bool = True) -> dict:
    """One llama-bench run (-o json): decode tokens/s for n_gen tokens (and prefill tokens/s for
    n_prompt tokens when > 0), with llama.cpp's own description of the build and the CPU.
    repack=False (--repack 0) keeps the weights in the file's layout: on the 2-core test machine
    (AVX-512 + AMX) the sdist's llama.cpp segfaults in a Q4_1 prefill with repacked weights."""
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
