"""Where a model's weights came from, in words: the quality lessons depend on it.

The default model arrives as a 4-bit GGUF (Q4_1: 4-bit weights in blocks of 32, each block with a scale
and a minimum). Dequantized to bf16 it runs like any 16-bit model, but its weights already lie on a
4-bit grid: requantizing them to int4 with 32-weight groups lands near that grid and can even "improve"
perplexity. The app says so next to every quality figure.
"""
from __future__ import annotations

from pathlib import Path

from engine.loading.errors import read_json

MARKER = "inferlab_conversion.json"  # written by gguf_convert next to a converted model
_GGML_TYPES = {  # llama.cpp's storage formats, as a reader of the figures needs them
    "F32": "32-bit float", "F16": "16-bit float", "BF16": "bf16",
    "Q4_0": "4-bit, 32-weight blocks with a scale", "Q4_1": "4-bit, 32-weight blocks with a scale and a minimum",
    "Q5_0": "5-bit, 32-weight blocks", "Q5_1": "5-bit, 32-weight blocks with a minimum",
    "Q8_0": "8-bit, 32-weight blocks", "Q2_K": "2-bit k-quant", "Q3_K": "3-bit k-quant",
    "Q4_K": "4-bit k-quant, 256-weight super-blocks", "Q5_K": "5-bit k-quant", "Q6_K": "6-bit k-quant",
}


def tensor_type_elements(reader) -> dict[str, int]:
    """Weights per GGML storage type of a `gguf.GGUFReader`, most first."""
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + int(t.n_elements)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _types_of(marker: dict) -> dict[str, int]:
    if marker.get("tensor_types"):
        return marker["tensor_types"]
    source = Path(marker.get("source", ""))
    if not source.is_file():  # an older conversion whose GGUF is gone: nothing to read the types from
        return {}
    import gguf

    return tensor_type_elements(gguf.GGUFReader(str(source)))


def weights_origin(folder: str | Path) -> str:
    """"dequantized from X.gguf: 79 % of the weights stored as Q4_1 (…)" for a converted GGUF; "" for a
    Hugging Face folder (its weights are what its safetensors hold)."""
    marker = read_json(Path(folder) / MARKER, lenient=True)
    if not marker:
        return ""
    name = Path(marker.get("source", "a GGUF file")).name
    types = _types_of(marker)
    total = sum(types.values())
    quantized = {t: n for t, n in types.items() if t not in ("F32", "F16", "BF16")}
    if not total or not quantized:
        return f"converted from {name}"
    parts = [f"{100 * n / total:.0f} % as {t} ({_GGML_TYPES.get(t, t)})" for t, n in quantized.items()]
    return f"dequantized from {name}: weights stored " + ", ".join(parts)
