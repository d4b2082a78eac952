"""The weight formats a quantizable layer can be stored in: one registry row per format, named
(EngineConfig.quant_format stores the name: "bf16", "int8", "fp8-e4m3", "int4"). Two formats may store the
same bits per weight (int8 and fp8-e4m3 both keep one byte), so nothing selects a format by its bits: the
bits are a property of the row (memory, the cost model), the name is the key.

Torch-free (a contract: the config validates against it, the app's sliders, presets and flags list it); the
module swaps that build each format live in engine/quant/schemes.py, keyed by the format's name.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class QuantFormat:
    name: str  # the key: what EngineConfig.quant_format, presets, flags and sweep points carry
    bits: int  # bits stored per weight (memory and the cost model read it; nothing selects by it)
    dense: bool  # the model's own weights: no quantized module is built
    grouped: bool  # scales per group of input columns (quant_group_size); else one per output row
    scale_bits: int  # bits stored per row (or per group) beside the codes: a 16-bit scale, or scale + zero
    short: str  # the slider's and a plot's few characters
    label: str  # a few words for messages and tooltips

    @property
    def quantized(self) -> bool:
        return not self.dense

    def overhead_bits(self, in_features: int, group_size: int = 32) -> float:
        """Scale bits per weight: one row's (or group's) scale_bits spread over its weights."""
        return self.scale_bits / (group_size if self.grouped else in_features)


DENSE = "bf16"  # the model's own 16-bit weights: the quality reference every other format is measured against
QUANT_FORMATS: tuple[QuantFormat, ...] = (  # from most bytes per weight to fewest: the slider's order
    QuantFormat(DENSE, 16, dense=True, grouped=False, scale_bits=0, short="bf16",
                label="the model's own 16-bit weights"),
    QuantFormat("int8", 8, dense=False, grouped=False, scale_bits=16, short="int8",
                label="int8, a scale per row"),
    # weight-only fp8 (OCP e4m3: 4 exponent bits, 3 mantissa bits, largest 448) with a 16-bit scale per output
    # row, the layout GPU servers deploy (vLLM's fp8 weight-only); the same byte per weight as int8, spent on
    # range instead of even steps
    QuantFormat("fp8-e4m3", 8, dense=False, grouped=False, scale_bits=16, short="fp8 e4m3",
                label="fp8 e4m3, a scale per row"),
    QuantFormat("int4", 4, dense=False, grouped=True, scale_bits=32, short="int4",
                label="int4, a scale and zero per group"),
)
QUANT_FORMAT_BY_NAME: Mapping[str, QuantFormat] = MappingProxyType({f.name: f for f in QUANT_FORMATS})
QUANT_FORMAT_NAMES: tuple[str, ...] = tuple(QUANT_FORMAT_BY_NAME)  # what quant_format takes, in slider order


def quant_format(name: str | QuantFormat) -> QuantFormat:
    """The format named `name` (a QuantFormat passes through); ValueError naming the ones there are."""
    if isinstance(name, QuantFormat):
        return name
    try:
        return QUANT_FORMAT_BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"quant_format must be one of {', '.join(QUANT_FORMAT_NAMES)}, got {name!r}") from None
