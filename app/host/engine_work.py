"""Slow jobs that run in the engine thread between steps: requantizing the weights and measuring
perplexity. The window stays live (only the engine pauses); progress goes out as channel.Busy items."""
from __future__ import annotations

from app.source import channel
from engine.drive import drive


def quantize(host, fmt: str, group_size: int | None = None) -> None:
    """Requantize from the original 16-bit weights; measure perplexity before and after when the
    source can (once per format), so the tradeoff plot gets a measured quality delta. The engine's
    per-layer weight error goes to the quantization-error heatmap."""
    engine = host.engine

    def busy(text: str, fraction: float | None) -> None:
        host.publish(channel.Busy(text, fraction))

    measure = host.info is not None and host.info.capabilities.perplexity
    try:
        if measure:
            measure_perplexity(host, busy)  # the current weights, before they change
        busy(f"quantizing weights to {fmt}…", 0.0)
        report = engine.set_quantization(fmt, group_size,
                                         progress=lambda message, f: busy(f"{fmt}: {message}", f))
        drive(engine, max_steps=1)  # the new layers are swapped in at the top of a step
        host.publish(channel.QuantError(fmt, report))  # {module: ||W - Ŵ|| / ||W||}
        # the KV cache took the bytes the weights freed (or gave them back)
        host.publish(channel.Quantized(engine.config.quant_format, engine.memory().kv_blocks_total))
        if measure:
            measure_perplexity(host, busy)
    finally:
        busy("", None)


def measure_perplexity(host, busy) -> None:
    fmt = host.engine.config.quant_format
    if fmt in host.perplexity:
        return
    busy(f"measuring perplexity of {fmt} weights on the held-out text…", None)
    host.perplexity[fmt] = host.engine.perplexity()
    host.publish(channel.Perplexity(dict(host.perplexity)))


def adopt_perplexity(host, by_format: dict[str, float]) -> None:
    """Perplexities measured elsewhere on the same held-out text with the same weights settings (a
    tradeoff sweep's): taken as known, so a requantization does not measure them again."""
    host.perplexity.update(by_format)
    host.publish(channel.Perplexity(dict(host.perplexity)))
