"""Which of a sweep's measured perplexities an applied point may reuse (a pure function: no Qt, no torch).

The sweep scores the same held-out text, with the same definition, as the live engine's perplexity
(engine/quant/quality.py); a figure carries over when the live engine will run the same weights: bf16
always, the point's own format when it is applied with the sweep's group size. The live engine's current
format is left alone when it equals the point's (applying does not requantize then, so the group size
the live weights have may differ from the sweep's)."""
from __future__ import annotations

from engine.quant_formats import DENSE


def reusable_perplexity(sweep_points: list[dict], config: dict, live_format: str) -> dict[str, float]:
    """{weight format: perplexity} from the sweep's points that the applied `config` may take as measured."""
    fmt, group = str(config.get("quant_format", DENSE)), config.get("quant_group_size")
    out: dict[str, float] = {}
    for p in sweep_points:
        ppl = p.get("perplexity")
        if ppl is None:
            continue
        if p["quant_format"] == DENSE:
            out[DENSE] = ppl
        elif p["quant_format"] == fmt and fmt != live_format and p.get("quant_group_size") == group:
            out[fmt] = ppl
    return out
