"""Counterfactuals that are computed, not run. Each result says so ("computed": true, and a note)."""
from __future__ import annotations

import math

from app.talk.compare.spec import ConfigSpec


def contiguous_reservation(c: ConfigSpec, measured, names) -> dict:
    """The KV memory a contiguous max-length reservation would hold for the requests of the previous,
    measured continuous run: every request that ran at once keeps max_model_len tokens from its first step to its
    last (what servers did before paging), against the paged blocks the run really used."""
    if measured is None:
        raise ValueError(f"'{c.label}' is computed from a measured continuous run before it, and there is none")
    entry, rec, max_model_len, block_size, block_bytes = measured
    peak_running = max((s.num_running for s in rec.steps), default=0)
    blocks = peak_running * math.ceil(max_model_len / block_size)
    total = rec.steps[-1].kv_blocks_total if rec.steps else 0
    metrics = {"kv_blocks_peak": blocks, "kv_bytes_peak": blocks * block_bytes, "kv_blocks": total}
    fits = total // math.ceil(max_model_len / block_size) if total else 0
    note = (f"computed, not run: {peak_running} requests ran at once in '{entry['label']}'; reserving "
            f"{max_model_len} tokens each would hold {blocks} blocks (this cache has {total}: "
            f"{fits} such request{'' if fits == 1 else 's'} fit at once)")
    return {"label": c.label, "config": {"mode": c.mode, **c.knobs}, "computed": True, "note": note,
            "metrics": {k: v for k, v in metrics.items() if k in names}}
