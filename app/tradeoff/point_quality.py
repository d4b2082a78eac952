"""Which of a sweep's measured perplexities an applied point may reuse (a pure function: no Qt, no torch).

The sweep scores the same held-out text, with the same definition, as the live engine's perplexity
(engine/quant/quality.py); a figure carries over when the live engine will run the same weights: 16 bits
always, the point's own bits when it is applied with the sweep's group size. The live engine's current
bits are left alone when they equal the point's (applying does not requantize then, so the group size
the live weights have may differ from the sweep's)."""
from __future__ import annotations


def reusable_perplexity(sweep_points: list[dict], config: dict, live_bits: int) -> dict[int, float]:
    """{weight bits: perplexity} from the sweep's points that the applied `config` may take as measured."""
    bits, group = int(config.get("quant_bits", 16)), config.get("quant_group_size")
    out: dict[int, float] = {}
    for p in sweep_points:
        ppl = p.get("perplexity")
        if ppl is None:
            continue
        if p["bits"] == 16:
            out[16] = ppl
        elif p["bits"] == bits and bits != live_bits and p.get("group_size") == group:
            out[bits] = ppl
    return out
