"""The engine's weight-quantization verbs: build quantized layers from the original 16-bit weights,
swap them in between steps, and measure perplexity. Mixed into LLMEngine."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.quality import activation_absmax, heldout_texts, perplexity
from engine.quant import outlier_channels as outlier_channels_for
from engine.quant import quantize_model, weight_error_report


class QuantizedWeights:
    """Needs from the engine: config, device, model, _originals, _act_absmax, _lock, _inbox, score()."""

    def build_quantized(self, bits: int, group_size: int | None = None, outlier_channels: int | None = None,
                        progress: Callable[[str, float], None] | None = None) -> dict:
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
        return quantize_model(self.model, originals, bits, group_size, outliers, cfg.quant_reference, progress)

    def set_quantization(self, bits: int, group_size: int | None = None, outlier_channels: int | None = None,
                         progress: Callable[[str, float], None] | None = None) -> dict[str, float]:
        """Requantize from the original weights and swap the new layers in at the top of the next step;
        queued and running requests carry on. Returns the per-layer relative weight error."""
        if bits not in (16, 8, 4):
            raise ValueError(f"bits must be 16, 8 or 4, got {bits}")
        modules = self.build_quantized(bits, group_size, outlier_channels, progress)
        settings = dict(quant_bits=bits, quant_group_size=group_size or self.config.quant_group_size,
                        quant_outlier_channels=self.config.quant_outlier_channels
                        if outlier_channels is None else outlier_channels)
        with self._lock:
            self._inbox.append(("swap", (modules, settings)))
        return weight_error_report(self._originals, modules)

    def perplexity(self, texts: Sequence[str] | None = None) -> float:
        """Perplexity of the current weights on `texts` (default: the held-out text in assets/)."""
        return perplexity(self, texts or heldout_texts())

