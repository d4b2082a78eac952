"""Quantizing while the model loads (engine/models/build.py's on_layer): each decoder layer is
quantized as soon as it is filled, its 16-bit weights copied to the host first (every later
requantization starts from them), so the device never holds more than one 16-bit layer beside the
quantized ones. On a GPU this is what lets a 4-bit model fit where its bf16 form would not.

Used at start-up on a GPU when the layers are to be quantized without outlier channels (those need
activation statistics from a running model: that path quantizes after loading, as the CPU does).
"""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.models.llama import LlamaForCausalLM
from engine.quant.weight_only import QUANTIZABLE, quantize_model
from engine.quant_formats import quant_format


def applies(config: EngineConfig, device: torch.device) -> bool:
    return device.type != "cpu" and quant_format(config.quant_format).quantized and not config.quant_outlier_channels


class QuantizeAtLoad:
    """on_layer for build_model. `originals`: the host copies of the 16-bit weights it quantized."""

    def __init__(self, fmt: str, group_size: int, reference: bool = False) -> None:
        self.fmt, self.group_size, self.reference = fmt, group_size, reference
        self.originals: dict[str, torch.Tensor] = {}
        self.bytes_16bit = 0  # what those layers took on the device before quantizing
        self.peak_layer_bytes = 0  # the largest 16-bit layer held at once

    def __call__(self, model: LlamaForCausalLM, index: int) -> None:
        prefix = f"layers.{index}."
        names = [n for n, _ in model.named_modules() if n.startswith(prefix) and n.split(".")[-1] in QUANTIZABLE]
        weights = {n: model.get_submodule(n).weight.detach() for n in names}
        layer_bytes = sum(w.numel() * w.element_size() for w in weights.values())
        self.bytes_16bit += layer_bytes
        self.peak_layer_bytes = max(self.peak_layer_bytes, layer_bytes)
        self.originals.update({n: self._to_host(w) for n, w in weights.items()})
        quantize_model(model, weights, self.fmt, self.group_size, reference=self.reference, install=True,
                       names=names)
        del weights  # the 16-bit layer goes with its last reference

    def _to_host(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.to("cpu")


def quantizer_for(config: EngineConfig, device: torch.device) -> QuantizeAtLoad | None:
    return QuantizeAtLoad(config.quant_format, config.quant_group_size, config.quant_reference) \
        if applies(config, device) else None
