"""The weight formats a quantizable layer can be stored in: one registry row per format, looked up by the
bits EngineConfig.quant_bits stores (16, 8, 4), so no code branches on a bare int.

Torch-free (a contract: the config validates against it, the app's sliders and presets list it); the
module swaps that build each format live in engine/quant/weight_only.py, keyed by the format's name.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class QuantFormat:
    name: str  # "bf16" (the model's own 16-bit weights), "int8", "int4"
    bits: int  # what EngineConfig.quant_bits stores
    dense: bool  # the model's own weights: no quantized module is built
    grouped: bool  # scales per group of input columns (quant_group_size); else one per output row
    scale_bits: int  # bits stored per row (or per group) beside the codes: a 16-bit scale, or scale + zero
    label: str  # a few words for messages and plots

    @property
    def quantized(self) -> bool:
        return not self.dense

    def overhead_bits(self, in_features: int, group_size: int = 32) -> float:
        """Scale bits per weight: one row's (or group's) scale_bits spread over its weights."""
        return self.scale_bits / (group_size if self.grouped else in_features)


QUANT_FORMATS: tuple[QuantFormat, ...] = (
    QuantFormat("bf16", 16, dense=True, grouped=False, scale_bits=0, label="16-bit"),
    QuantFormat("int8", 8, dense=False, grouped=False, scale_bits=16, label="int8, a scale per row"),
    QuantFormat("int4", 4, dense=False, grouped=True, scale_bits=32, label="int4, a scale and zero per group"),
)
QUANT_FORMAT_BY_BITS: Mapping[int, QuantFormat] = MappingProxyType({f.bits: f for f in QUANT_FORMATS})
QUANT_BITS: tuple[int, ...] = tuple(f.bits for f in QUANT_FORMATS)  # (16, 8, 4): what quant_bits takes


def quant_format(bits: int) -> QuantFormat:
    """The format stored at `bits`; ValueError naming the ones there are."""
    try:
        return QUANT_FORMAT_BY_BITS[bits]
    except (KeyError, TypeError):
        raise ValueError(f"bits must be {', '.join(map(str, QUANT_BITS[:-1]))} or {QUANT_BITS[-1]}, "
                         f"got {bits}") from None
