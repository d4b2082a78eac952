"""The weights manager: the engine's part that owns what the weights are and what they cost.

It keeps the original 16-bit weights of every quantizable layer (the source of every requantization,
so int8 -> int4 -> 16 never compounds error), builds quantized layers from them off the engine thread,
swaps them in between steps (SwapWeights), and re-sizes the KV cache to what the new weight bytes leave:
at the same total memory, every byte quantization takes off the weights buys KV blocks.
"""
from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import torch
from torch import nn

from engine.commands import SwapWeights
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.models.layers.linear import pack_linears, set_matmul_dtype, set_stream_kernel
from engine.quant.at_load import QuantizeAtLoad
from engine.quant.weight_only import original_weights, quantize_model, swap_modules, weight_error_report
from engine.quant.weight_only import outlier_channels as outlier_channels_for
from engine.quant_formats import quant_format
from engine.runner.huge_pages import move_to_huge_pages
from engine.runner.memory import weights_bytes
from engine.runner.model_runner import ModelRunner
from engine.runner.setup import KvSizing, kv_blocks_after_requant, num_kv_blocks

Progress = Callable[[str, float], None]


class WeightsManager:
    """`calibrate()` returns the per-layer input-channel |activation| maxima (on held-out text) that
    outlier channels are picked from; it is called once, the first time they are asked for.
    `stream_kernel`: the native weight-streaming module every (swapped-in) layer is given, or None."""

    def __init__(self, model: nn.Module, config: EngineConfig, device: torch.device, block_bytes: int,
                 calibrate: Callable[[], dict[str, torch.Tensor]], reserved_bytes: int = 0,
                 profile_peak: Callable[[], int] | None = None, other_weights_bytes: int = 0,
                 at_load: QuantizeAtLoad | None = None, stream_kernel=None,
                 matmul_dtype: torch.dtype | None = None,
                 profile_graphs: Callable[[], int] | None = None, on_huge_pages: bool = False) -> None:
        """`block_bytes`: one KV block across every cache of the engine's block count (a draft model's
        too); `other_weights_bytes`: weights beside this model's inside the same budget (a draft's);
        `profile_peak`: the warm-up that measures a step's peak on a GPU (engine/runner/profile.py);
        `profile_graphs`: with cuda_graphs, what measures the start-up decode graphs' bytes (the same file);
        `at_load`: the layers were quantized while loading (engine/quant/at_load.py), their 16-bit
        originals already on the host; `matmul_dtype`: what every (swapped-in) Linear's library products
        compute in, when wider than its weights (engine/runner/cpu_compute.py); `on_huge_pages`: the model was
        built with its weights already in a huge-page arena (engine/runner/huge_pages.ArenaPlan)."""
        self.model = model
        self.stream_kernel = stream_kernel
        self.matmul_dtype = matmul_dtype
        self.device = device
        self.block_bytes = block_bytes
        self._calibrate = calibrate
        self._act_absmax: dict[str, torch.Tensor] | None = None
        # before the originals are taken: they are the same tensors, so they move once, not twice
        self.on_huge_pages = on_huge_pages  # some weights are on huge pages (the engine line says so)
        self._to_huge_pages()
        # The 16-bit weights of every quantizable layer (on the host: a GPU keeps only what runs).
        done = at_load.originals if at_load else {}
        self.originals = dict(done) | {n: w.to("cpu") if device.type != "cpu" else w
                                       for n, w in original_weights(model, skip=set(done)).items()}
        weights16 = weights_bytes(model) + (at_load.bytes_16bit - _module_bytes(model, done) if at_load else 0)
        # layer by layer, each swapped in
        if config.quant_embeddings or (quant_format(config.quant_format).quantized and not at_load):
            self.build_quantized(config, config.quant_format, install=True)
        weights_saved = weights16 - weights_bytes(model)
        self.packed_bytes = pack_linears(model, config.pack_weights)
        set_stream_kernel(model, stream_kernel)
        set_matmul_dtype(model, matmul_dtype)
        self._to_huge_pages()  # the quantized layers and packed copies just built
        self.weights_bytes = weights_bytes(model)  # with the packed copies
        self._other_weights = other_weights_bytes
        self.kv_sizing = KvSizing()  # what sized the cache, in order (profile, graphs, kv)
        blocks = num_kv_blocks(config, device, block_bytes, self.weights_bytes + other_weights_bytes, weights_saved,
                               reserved_bytes, profile_peak, profile_graphs, self.kv_sizing)
        # runtime requantization resizes the cache from here
        self._kv_base = (blocks, self.weights_bytes + other_weights_bytes)
        self.kv_target = blocks  # the KV blocks the current weights leave room for

    def _to_huge_pages(self) -> None:
        """Tensors new since the last move (quantized layers, packed copies) into a huge-page arena too;
        what is there already stays (engine/runner/huge_pages.py)."""
        if self.device.type == "cpu" and move_to_huge_pages(self.model):
            self.on_huge_pages = True

    def set_stream_kernel(self, kernel) -> None:
        """The native weight-streaming module for every layer (one built in the background arrives late)."""
        self.stream_kernel = kernel
        set_stream_kernel(self.model, kernel)

    def build_quantized(self, config: EngineConfig, fmt: str, group_size: int | None = None,
                        outlier_channels: int | None = None, progress: Progress | None = None,
                        embeddings: bool | None = None, install: bool = False) -> dict:
        """Quantized modules built from the original 16-bit weights (slow: run it off the GUI thread),
        one layer's original on the device at a time. Outlier channels need activation statistics,
        gathered once from the held-out text (kept on the host, beside the originals)."""
        group_size = group_size or config.quant_group_size
        n_out = config.quant_outlier_channels if outlier_channels is None else outlier_channels
        outliers = None
        if n_out and quant_format(fmt).quantized:
            if self._act_absmax is None:
                self._act_absmax = {n: a.to("cpu") for n, a in self._calibrate().items()}
            outliers = outlier_channels_for(self._act_absmax, self.originals, n_out)
        embeddings = config.quant_embeddings if embeddings is None else embeddings
        return quantize_model(self.model, self.originals, fmt, group_size, outliers, config.quant_reference,
                              progress, embeddings, device=self.device, install=install)

    def prepare_swap(self, config: EngineConfig, fmt: str, group_size: int | None = None,
                     outlier_channels: int | None = None, progress: Progress | None = None,
                     embeddings: bool | None = None) -> tuple[SwapWeights, dict[str, float]]:
        """The SwapWeights command for a requantization, and the per-layer relative weight error."""
        fmt = quant_format(fmt).name  # ValueError naming the formats there are
        modules = self.build_quantized(config, fmt, group_size, outlier_channels, progress, embeddings)
        settings = dict(quant_format=fmt, quant_group_size=group_size or config.quant_group_size,
                        quant_embeddings=config.quant_embeddings if embeddings is None else embeddings,
                        quant_outlier_channels=config.quant_outlier_channels
                        if outlier_channels is None else outlier_channels)
        command = SwapWeights(MappingProxyType(modules), MappingProxyType(settings))
        return command, weight_error_report(self.originals, modules)

    def apply_swap(self, command: SwapWeights, config: EngineConfig) -> None:
        """Swap the new layers in (engine thread, between steps) and set the KV target they leave."""
        swap_modules(self.model, dict(command.modules))
        self.packed_bytes = pack_linears(self.model, config.pack_weights)
        set_stream_kernel(self.model, self.stream_kernel)
        set_matmul_dtype(self.model, self.matmul_dtype)
        self.model.set_compiled(self.model.compiled)  # new 16-bit layers get the single-row kernel
        self._to_huge_pages()
        self.weights_bytes = weights_bytes(self.model)
        self.kv_target = kv_blocks_after_requant(config, *self._kv_base, self.weights_bytes + self._other_weights,
                                                 self.block_bytes)

    def fit_kv(self, block_manager: BlockManager, runner: ModelRunner) -> None:
        """Give the KV cache the blocks the weight size leaves (at the top of a step): growing is
        immediate; shrinking goes as far as the blocks at the top are free and resumes as they free up."""
        if self.kv_target == block_manager.num_blocks:
            return
        n = block_manager.resize(self.kv_target)
        if n * block_manager.block_size != runner.kv_caches[0][0].shape[1]:
            runner.resize_kv(n)


def _module_bytes(model: nn.Module, names) -> int:
    """Bytes of the named modules' tensors (quantized layers: weights, scales, outlier columns)."""
    return sum(t.numel() * t.element_size() for n in names
               for t in list(model.get_submodule(n).parameters()) + list(model.get_submodule(n).buffers()))
