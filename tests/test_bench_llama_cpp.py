"""llama.cpp as the benches' peer (app/bench/llama_cpp.py). Everything that runs its binaries is marked
`llama_cpp` and skips where scripts/build_llama_cpp.sh has not built them (INFERLAB_LLAMA_CPP_DIR, or
the script's default folder)."""
from __future__ import annotations

import json

import llama_cpp_peer
import pytest

from app.bench import llama_cpp


def test_missing_binaries_are_none_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    assert llama_cpp.llama_cpp_dir() == tmp_path
    assert llama_cpp.find_binary() is None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-bench").write_text("")  # there, but not executable
    assert llama_cpp.find_binary() is None


def test_the_4_bit_peer_runs_the_gguf_the_weights_came_from(tmp_path):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tmp_path / "converted"
    folder.mkdir()
    assert llama_cpp.gguf_for_format(str(folder), "int4") is None  # not converted from a GGUF: no same-weights file
    (folder / "inferlab_conversion.json").write_text(json.dumps({"source": str(gguf)}))
    assert llama_cpp.gguf_for_format(str(folder), "int4") == gguf
    assert llama_cpp.gguf_for_format(str(folder), "int8") is None


@pytest.mark.llama_cpp
def test_llama_bench_reports_decode_speed_and_the_cpu():
    binary, gguf = llama_cpp_peer.tool("llama-bench"), llama_cpp_peer.default_q4_gguf()
    # (--repack 0: the file's layout, so that a build without the AMX patch runs too; the patched build's
    # repacked prompt is tests/test_llama_cpp_patch.py's)
    run = llama_cpp.llama_bench(binary, gguf, threads=1, n_gen=4, n_prompt=8, repack=False)
    assert run["decode_tokens_per_s"] > 0 and run["prefill_tokens_per_s"] > 0
    assert run["cpu_info"] and run["model_size_bytes"] > 0 and str(binary) in run["command"]
