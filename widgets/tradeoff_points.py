"""The tradeoff plot's points, as plain data: cost per million tokens, the quality colour, each kind of
point's label (a sweep's, a predicted one's, a managed server's: engine, model and flags) and where a
label fits on screen."""
from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QColor

from engine.knobs import KnobValues
from engine.quant_formats import QUANT_FORMAT_BY_NAME
from widgets.theme import blend

AGREEMENT_BAD = 0.80  # top-1 agreement drawn fully red
NOT_MEASURED = "quality not measured"
PREDICTED = "predicted"
_GOOD, _MID, _BAD, _NONE = QColor("#59a14f"), QColor("#edc948"), QColor("#e15759"), QColor("#9aa0a6")


def cost_per_million_tokens(price_per_hour: float, total_tokens_per_s: float | None) -> float | None:
    """$ per 1M tokens = price per hour / tokens per hour * 1e6 (None without throughput)."""
    if not total_tokens_per_s or total_tokens_per_s <= 0:
        return None
    return price_per_hour / (total_tokens_per_s * 3600.0) * 1e6


def quality_color(agreement: float | None) -> QColor:
    """Green at 100 % top-1 agreement, yellow half-way, red at AGREEMENT_BAD or below; grey unmeasured."""
    if agreement is None:
        return _NONE
    t = min(1.0, max(0.0, (1.0 - agreement) / (1.0 - AGREEMENT_BAD)))
    return blend(_GOOD, _MID, 2 * t) if t < 0.5 else blend(_MID, _BAD, 2 * t - 1)


# a sweep point is named by the knobs it sets (app/tradeoff/sweep.py), in the knob table's words
POINT_KNOBS = ("max_num_seqs", "quant_format", "num_speculative_tokens", "quant_group_size")


def sweep_label(p: dict) -> str:
    return (f"batch {p['max_num_seqs']} · {_format_short(p['quant_format'])} · "
            f"k={p['num_speculative_tokens']}")


def _format_short(name: str) -> str:
    fmt = QUANT_FORMAT_BY_NAME.get(name)
    return fmt.short if fmt is not None else str(name)


def sweep_config(p: dict) -> KnobValues:
    """The engine settings a sweep point was measured with (its weights' group size when it has one)."""
    config: KnobValues = {"max_num_seqs": p["max_num_seqs"], "quant_format": p["quant_format"],
                          "num_speculative_tokens": p["num_speculative_tokens"]}
    if p.get("quant_group_size"):
        config["quant_group_size"] = p["quant_group_size"]
    return config


def point_batch(p: dict) -> int | None:
    """The batch size a measured point ran at: the explorer's sweep names it by knob (max_num_seqs), a managed
    server's tuning sweep (app/tradeoff/tune.py) by its ServerPoint field (batch)."""
    batch = p.get("max_num_seqs", p.get("batch"))
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else None


def short_label(p: dict) -> str | None:
    """A measured point's label where its full one is not shown (off the frontier): batch, format, drafts;
    a managed server's point by its weight format's label (Q4_1, fp8: app/managed/formats.py, carried in the
    point as weight_label); None for a point without them (a live configuration's, or a tuning point stored
    before formats had names, with only its bits: no format is guessed from a bit count)."""
    if isinstance(p.get("max_num_seqs"), int) and isinstance(p.get("quant_format"), str):
        draft = p.get("num_speculative_tokens")
        return f"b{p['max_num_seqs']} {_format_short(p['quant_format'])}" + (f" k{draft}" if draft else "")
    fmt = p.get("weight_label", p.get("weight_format"))
    if isinstance(p.get("batch"), int) and isinstance(fmt, str):
        return f"b{p['batch']} {fmt[:24]}" + (f" k{p['draft']}" if p.get("draft") else "")
    return None


def spread_bars(points: dict[str, dict], pos: dict[str, tuple[float, float]], price: float) -> dict[str, list]:
    """pyqtgraph ErrorBarItem arguments (log10 coordinates) for the points measured more than once: the
    least and the most of their per-user tokens/s (x) and $/1M tokens (y, from the total tokens/s)."""
    out: dict[str, list] = {k: [] for k in ("x", "y", "left", "right", "top", "bottom")}
    for label, p in points.items():
        spread = p.get("spread") or {}
        users, totals = spread.get("tokens_per_s_user"), spread.get("tokens_per_s_total")
        if label not in pos or not users or not totals or min(*users, *totals) <= 0:
            continue
        x, y = (math.log10(v) for v in pos[label])
        dear, cheap = cost_per_million_tokens(price, totals[0]), cost_per_million_tokens(price, totals[1])
        if dear is None or cheap is None:  # (not with positive totals: the check above)
            continue
        out["x"].append(x)
        out["y"].append(y)
        out["left"].append(max(0.0, x - math.log10(users[0])))
        out["right"].append(max(0.0, math.log10(users[1]) - x))
        out["top"].append(max(0.0, math.log10(dear) - y))
        out["bottom"].append(max(0.0, y - math.log10(cheap)))
    return out


def predicted_label(p: dict) -> str:
    return f"{p['model']} {_format_short(p['quant_format'])} {p['device']} batch {p['max_num_seqs']} ({PREDICTED})"

def free_spot(at: QPointF, w: float, h: float, r: float, right_half: bool, box: QRectF,
              taken: list[QRectF]) -> tuple[tuple[float, float], QRectF] | None:
    """The first spot around the point `at` for a w x h label that stays inside `box` and meets
    nothing `taken`: (the TextItem's anchor, the label's rect on screen), or None."""
    # (dx, dy) of the label's top-left corner from the point, with the matching TextItem anchor:
    # anchors place the text's box relative to the point; the offsets keep it clear of the marker
    toward_middle = [("left", "above"), ("left", "below"), ("left", "beside")] if right_half else \
        [("right", "above"), ("right", "below"), ("right", "beside")]
    away = [(("right" if side == "left" else "left"), where) for side, where in toward_middle]
    for side, where in toward_middle + away:
        x = at.x() - w - (r if where == "beside" else 0) if side == "left" else \
            at.x() + (r if where == "beside" else 0)
        y = {"above": at.y() - r - h, "below": at.y() + r, "beside": at.y() - h / 2}[where]
        rect = QRectF(x, y, w, h)
        if not box.contains(rect) or any(rect.intersects(t) for t in taken):
            continue
        # the TextItem's anchor for this rect: the point's position inside the rect, as fractions
        return ((at.x() - x) / w, (at.y() - y) / h), rect
    return None


def server_label(engine: str, model: str, point_label: str) -> str:
    """A managed server's point (issue 29): its engine, its model and its point in the app's words."""
    return f"{engine} · {model} · {point_label}"


def gap_text(live: dict, swept: dict) -> str:
    """Why the live point sits off the sweep's point of the same configuration: the sweep kept its batch
    full (a closed loop, no waiting), the live load is Poisson arrivals at the slider's rate."""
    batch = swept.get("max_num_seqs", "?")
    ratio = swept["tokens_per_s_total"] / live["tokens_per_s_total"] if live.get("tokens_per_s_total") else None
    rate = (live.get("config") or {}).get("arrival_rate")
    arrivals = f"arrivals at {rate:g} req/s" if isinstance(rate, (int, float)) else "the live arrivals"
    times = f" ({ratio:.1f}x the live {live['tokens_per_s_total']:.0f})" if ratio else ""
    return (f"live: {live['tokens_per_s_user']:.1f} tok/s per user, {live['tokens_per_s_total']:.0f} total with "
            f"{arrivals}. The sweep measured this configuration with {batch} requests always in flight (its "
            f"batch full, nothing waiting): {swept['tokens_per_s_total']:.0f} tok/s total{times}. Fewer requests "
            "in flight, fewer tokens per step.")
