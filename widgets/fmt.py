"""Human-readable numbers for labels and tooltips."""
from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal above bytes."""
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), len(_UNITS) - 1)
    return f"{n / 1024 ** exp:.1f} {_UNITS[exp]}"


def ms(seconds: float | None) -> str:
    """0.1234 -> '123 ms'; None -> '—'."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    v = seconds * 1e3
    return f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"


def rate(x: float | None, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return f"— {unit}"
    return f"{x:.1f} {unit}" if x < 1000 else f"{x:,.0f} {unit}"
