"""The weight formats a managed server (or a tuning sweep) serves, by NAME: one table, one row per format.

A point of `inferlab tune` and a managed server's weights slider carry a format's name, never a bit count:
two formats may store the same bits (llama.cpp's q4_0 and q4_1; inferlab's int8 and fp8-e4m3), so the bits
are a property of the row (the sweep's order, the label), the name is the key. The names are each engine's
own: llama.cpp's GGUF file types (`bf16`, `f16`, `q8_0`, `q4_1`, `q4_0`, `q4_k_m`), vLLM/SGLang's
`--quantization` methods (`fp8`, `awq`, `gptq`), inferlab's QuantFormat rows (engine/quant_formats.py, read
from there). `bf16` is every engine's unquantized checkpoint and the sweep's quality reference.

`slider` is the app's weights slider stop (an engine QuantFormat name) a row stands for on a managed server:
moving that slider picks the engine's row for the stop (the first the model has files for).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from engine.quant_formats import DENSE, QUANT_FORMATS

LLAMA = ("llama-server",)
HF = ("vllm", "sglang")  # both serve a Hugging Face checkpoint and quantize at load with --quantization
ALL = ("llama-server", "vllm", "sglang", "inferlab")


@dataclass(frozen=True, slots=True)
class ServerFormat:
    name: str  # the key: what ServerPoint.weight_format, --formats, --weights NAME=PATH and the JSON carry
    label: str  # the slider's, a plot's and a point label's few characters
    bits_per_weight: float  # codes and scales, per weight (the sweep's order: most bytes first)
    engines: tuple[str, ...]  # the engine kinds (app/managed/engines.py names) that can serve it
    slider: str | None = None  # the app's weights slider stop it stands for (engine/quant_formats.py name)
    gguf_type: str | None = None  # llama.cpp: the GGUF file type (llama-quantize's type name)
    quantization: str | None = None  # vLLM/SGLang: `--quantization` method when no checkpoint is given
    at_load: bool = False  # inferlab: the engine quantizes the 16-bit weights as it loads them

    @property
    def makeable(self) -> bool:
        """Made from the 16-bit weights (a converted GGUF, online quantization, at load); else it needs
        its own checkpoint (--weights NAME=PATH)."""
        return self.reference or bool(self.gguf_type or self.quantization) or self.at_load

    @property
    def reference(self) -> bool:
        """Unquantized 16-bit weights: the quality every other point is compared with."""
        return self.bits_per_weight >= 16


# inferlab serve --quant-format: the engine's own rows (their scales at the default group size of 32)
_ENGINE_OWN = tuple(ServerFormat(f.name, f.short, f.bits + f.overhead_bits(4096, 32), ("inferlab",), slider=f.name,
                                 at_load=True) for f in QUANT_FORMATS if f.quantized)
SERVER_FORMATS: tuple[ServerFormat, ...] = (
    ServerFormat(DENSE, "bf16", 16, ALL, slider=DENSE, gguf_type="BF16"),
    ServerFormat("f16", "f16", 16, LLAMA, slider=DENSE, gguf_type="F16"),
    # llama.cpp's block formats (ggml-common.h): 32 weights per block with an f16 scale (and an f16 min: _1)
    ServerFormat("q8_0", "Q8_0", 8.5, LLAMA, slider="int8", gguf_type="Q8_0"),
    ServerFormat("fp8", "fp8", 8, HF, slider="fp8-e4m3", quantization="fp8"),  # both engines' fp8 = e4m3
    *_ENGINE_OWN,
    ServerFormat("q4_1", "Q4_1", 5.0, LLAMA, slider="int4", gguf_type="Q4_1"),
    ServerFormat("q4_k_m", "Q4_K_M", 4.85, LLAMA, slider="int4", gguf_type="Q4_K_M"),
    ServerFormat("q4_0", "Q4_0", 4.5, LLAMA, slider="int4", gguf_type="Q4_0"),
    # 4-bit checkpoints for vLLM/SGLang: the checkpoint's own config names its method (no flag; --weights NAME=PATH)
    ServerFormat("awq", "AWQ", 4.25, HF, slider="int4"),
    ServerFormat("gptq", "GPTQ", 4.25, HF, slider="int4"),
)
SERVER_FORMAT_BY_NAME: Mapping[str, ServerFormat] = MappingProxyType({f.name: f for f in SERVER_FORMATS})
REFERENCE = DENSE


def server_format(name: object, engine: str | None = None) -> ServerFormat:
    """The row named `name` (one `engine` can serve, when given); ValueError naming the ones there are."""
    fmt = SERVER_FORMAT_BY_NAME.get(name) if isinstance(name, str) else None
    if fmt is None or (engine is not None and engine not in fmt.engines):
        have = ", ".join(formats_for(engine)) if engine else ", ".join(SERVER_FORMAT_BY_NAME)
        where = f" {engine}" if engine else ""
        raise ValueError(f"weight format {name!r}: not one{where} serves (the names: {have})")
    return fmt


def known_engine(engine: str) -> str | None:
    """`engine` when the table lists formats for it, else None (a flag table of the tests' own: names only)."""
    return engine if engine in ALL else None


def formats_for(engine: str | None) -> tuple[str, ...]:
    """The format names `engine` serves, most bytes per weight first (every format for None)."""
    return tuple(f.name for f in SERVER_FORMATS if engine is None or engine in f.engines)


def default_formats(engine: str) -> tuple[str, ...]:
    """`inferlab tune`'s formats when none are named: the engine's first row per slider stop (llama-server:
    bf16, q8_0, q4_1; vLLM/SGLang: bf16, fp8 (online); inferlab: bf16, int8, fp8-e4m3, int4)."""
    out: dict[str, str] = {}
    for f in SERVER_FORMATS:
        if engine in f.engines and f.slider and f.slider not in out and f.makeable:
            out[f.slider] = f.name
    return tuple(out.values())


def for_slider(engine: str, stop: str, have: Collection[str] = ()) -> ServerFormat:
    """The row a weights slider stop means on `engine`: the first the model has weights for (`have`), else
    the first the engine can make; ValueError when the engine has none for that stop."""
    rows = [f for f in SERVER_FORMATS if engine in f.engines and f.slider == stop]
    if not rows:
        stops = sorted({f.slider for f in SERVER_FORMATS if engine in f.engines and f.slider})
        raise ValueError(f"{engine} serves no weights for the {stop!r} stop (it has: {', '.join(stops)})")
    return next((f for f in rows if f.name in have), rows[0])


def parse_formats(text: str | list[str], engine: str | None = None) -> tuple[str, ...]:
    """"bf16,q8_0 q4_1" (or a list of such) -> ("bf16", "q8_0", "q4_1"): known names, each once, in order."""
    items = [text] if isinstance(text, str) else list(text)
    names = [t for item in items for t in item.replace(",", " ").split()]
    if not names:
        raise ValueError("give at least one weight format")
    return tuple(dict.fromkeys(server_format(n, engine).name for n in names))
