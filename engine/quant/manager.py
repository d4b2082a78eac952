"""The engine's weight-quantization verbs: build quantized layers from the original 16-bit weights,
swap them in between steps, and measure perplexity. Mixed into LLMEngine."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.quant.quality import activation_absmax, heldout_texts, perplexity
from engine.quant.weight_only import outlier_channels as outlier_channels_for
from engine.quant.weight_only import quantize_model, weight_error_report


class QuantizedWeights:
    """Needs from the engine: config, device, model, _originals, _act_absmax, _lock, _inbox, score(),
    block_manager, runner, _kv_target."""

    def build_quantized(self, bits: int, group_size: int | None = None, outlier_channels: int | None = None,
                        progress: Callable[[str, float], None] | None = None,
                        embeddings: bool | None = None) -> dict:
        """Quantized modules built from the original 16-bit weights (slow: run it off the GUI thread).
        Outlier channels need activation statistics, gathered once from the held-out text."""
        cfg = self.config
        group_size = group_size or cfg.quant_group_size
        n_out = cfg.quant_outlier_channels if outlier_channels is None else outlier_channels
        outliers = None
        if n_out and bits != 16:
            if self._act_absmax is None:
                self._act_absmax = activation_absmax(self, heldout_texts())
            outliers = outlier_channels_for(self._act_absmax, self._originals, n_out)
        originals = {n: w.to(self.device) for n, w in self._originals.items()}
        embeddings = cfg.quant_embeddings if embeddings is None else embeddings
        return quantize_model(self.model, originals, bits, group_size, outliers, cfg.quant_reference, progress,
                              embeddings)

    def set_quantization(self, bits: int, group_size: int | None = None, outlier_channels: int | None = None,
                         progress: Callable[[str, float], None] | None = None,
                         embeddings: bool | None = None) -> dict[str, float]:
        """Requantize from the original weights and swap the new layers in at the top of the next step;
        queued and running requests carry on. Returns the per-layer relative weight error."""
        if bits not in (16, 8, 4):
            raise ValueError(f"bits must be 16, 8 or 4, got {bits}")
        modules = self.build_quantized(bits, group_size, outlier_channels, progress, embeddings)
        settings = dict(quant_bits=bits, quant_group_size=group_size or self.config.quant_group_size,
                        quant_embeddings=self.config.quant_embeddings if embeddings is None else embeddings,
                        quant_outlier_channels=self.config.quant_outlier_channels
                        if outlier_channels is None else outlier_channels)
        with self._lock:
            self._inbox.append(("swap", (modules, settings)))
        return weight_error_report(self._originals, modules)

    def _resize_kv(self) -> None:
        """Give the KV cache the blocks the new weight size leaves (at the top of a step): growing is
        immediate; shrinking goes as far as the blocks at the top are free and resumes as they free up."""
        n = self.block_manager.resize(self._kv_target)
        if n * self.config.block_size != self.runner.kv_caches[0][0].shape[1]:
            self.runner.resize_kv(n)

    def perplexity(self, texts: Sequence[str] | None = None) -> float:
        """Perplexity of the current weights on `texts` (default: the held-out text in assets/)."""
        return perplexity(self, texts or heldout_texts())

