"""One line per result, for stderr and the report: the headline metric of each configuration and its
ratio to the first. Plain dicts in, text out (no torch)."""
from __future__ import annotations


def _num(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.2f} G"
    if a >= 1e6:
        return f"{v / 1e6:.1f} M"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def headline_text(result: dict) -> str:
    if result.get("not_built"):
        return result["not_built"]
    if not result.get("metrics"):
        return "no metrics"
    name = result.get("headline") if result.get("headline") in result["metrics"] else result["metrics"][0]
    rows = result.get("comparison", [])
    first = rows[0]["metrics"].get(name) if rows else None
    parts = []
    for r in rows:
        v = r["metrics"].get(name)
        if v is None:
            parts.append(f"{r['label']}: n/a")
            continue
        ratio = f" ({v / first:.2f}x)" if first and r is not rows[0] else ""
        tag = " [computed]" if r.get("computed") else ""
        parts.append(f"{r['label']}: {_num(v)}{ratio}{tag}")
    return f"{name}: " + "; ".join(parts)


def speculation_speedup(result: dict | None) -> float | None:
    """tokens/s with speculation over without, when a comparison ran both (its first configuration
    without drafts, its last with them); None otherwise."""
    rows = (result or {}).get("comparison", [])
    if len(rows) < 2:
        return None
    def drafts(r: dict) -> int:
        return int(r.get("config", {}).get("num_speculative_tokens") or 0)
    first, last = rows[0], rows[-1]
    a, b = first["metrics"].get("tokens_per_s"), last["metrics"].get("tokens_per_s")
    if drafts(first) or not drafts(last) or not a or b is None:
        return None
    return b / a
