"""Light and dark palettes, and the one colour table every panel shares.

Panels never hard-code colours: token sources, memory categories, scheduling phases and request ids
all map to colours here, so the same request is the same colour in the block map and the Gantt chart,
and "prefill" is the same orange in the timeline and the Gantt chart.

A panel asks `is_dark(self.palette())` at paint time, so switching the theme (which sends every
widget a PaletteChange) is enough to restyle everything.
"""
from __future__ import annotations

import zlib
from types import MappingProxyType

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from engine.events import TokenSource

THEMES = ("dark", "light")

# Window, base, alternate base, text, button, highlight, mid (borders), disabled text
_PALETTES = MappingProxyType({
    "dark": MappingProxyType({
        "window": "#202124", "base": "#17181a", "alt_base": "#26282c", "text": "#e8eaed",
        "button": "#2d2f33", "highlight": "#5b8def", "mid": "#5f6368", "disabled": "#7b7f85",
        "tooltip": "#303134",
    }),
    "light": MappingProxyType({
        "window": "#f4f5f7", "base": "#ffffff", "alt_base": "#eef0f3", "text": "#202124",
        "button": "#e8eaed", "highlight": "#1a73e8", "mid": "#9aa0a6", "disabled": "#9aa0a6",
        "tooltip": "#ffffff",
    }),
})

# Token text colour by provenance; one variant per theme so both stay readable.
TOKEN_SOURCE_COLORS = MappingProxyType({
    "dark": MappingProxyType({
        TokenSource.PROMPT: "#9aa0a6", TokenSource.DECODED: "#e8eaed",
        TokenSource.ACCEPTED: "#81c995", TokenSource.CORRECTED: "#f28b82",
        TokenSource.BONUS: "#fdd663",
    }),
    "light": MappingProxyType({
        TokenSource.PROMPT: "#5f6368", TokenSource.DECODED: "#202124",
        TokenSource.ACCEPTED: "#137333", TokenSource.CORRECTED: "#c5221f",
        TokenSource.BONUS: "#a05a00",
    }),
})
TOKEN_SOURCE_LABELS = MappingProxyType({
    TokenSource.PROMPT: "prompt", TokenSource.DECODED: "decoded",
    TokenSource.ACCEPTED: "accepted draft", TokenSource.CORRECTED: "corrected",
    TokenSource.BONUS: "bonus",
})
# Alternating token background: (even, odd); even is transparent so the odd one shows boundaries.
TOKEN_ALT_BACKGROUND = MappingProxyType({"dark": "#34373c", "light": "#e3e8ef"})

# Device memory categories, in bar order.
MEMORY_CATEGORIES = ("weights", "kv_used", "kv_cached", "kv_free", "activations", "graphs", "other", "free")
MEMORY_LABELS = MappingProxyType({
    "weights": "Weights", "kv_used": "KV in use", "kv_cached": "KV cached (reusable prefix)",
    "kv_free": "KV free", "activations": "Activations / workspace",
    "graphs": "CUDA graphs (measured)", "other": "Other",
    "free": "Free device memory",
})
_MEMORY_COLORS = MappingProxyType({
    "weights": "#4e79a7", "kv_used": "#f28e2b", "kv_cached": "#edc948", "kv_free": "#9c755f",
    "activations": "#b07aa1", "graphs": "#ff9da7", "other": "#76b7b2",
})
_FREE_COLOR = MappingProxyType({"dark": "#3c4043", "light": "#d5d8dc"})

# Scheduling phases (timeline bars, Gantt segments) and step events.
PHASE_COLORS = MappingProxyType({
    "queued": "#9e9e9e", "prefill": "#f28e2b", "decode": "#4e79a7", "verify": "#b07aa1",
    "preempted": "#e15759", "finished": "#59a14f", "rejected": "#ff9da7",
    "running": "#59a14f", "waiting": "#edc948",
})
FINISH_COLORS = MappingProxyType({
    "stop": "#59a14f", "length": "#76b7b2", "abort": "#e15759", "error": "#e15759",
    "rejected": "#ff9da7",
})


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def theme_name(palette: QPalette) -> str:
    return "dark" if is_dark(palette) else "light"


def token_color(source: TokenSource, palette: QPalette) -> QColor:
    return QColor(TOKEN_SOURCE_COLORS[theme_name(palette)][source])


def token_alt_background(palette: QPalette) -> QColor:
    return QColor(TOKEN_ALT_BACKGROUND[theme_name(palette)])


def memory_color(category: str, palette: QPalette) -> QColor:
    if category == "free":
        return QColor(_FREE_COLOR[theme_name(palette)])
    return QColor(_MEMORY_COLORS[category])


def free_block_color(palette: QPalette) -> QColor:
    return QColor(_FREE_COLOR[theme_name(palette)])


def phase_color(phase: str) -> QColor:
    return QColor(PHASE_COLORS[phase])


def request_color(request_id: str) -> QColor:
    """A stable, saturated colour per request id (same in every panel and every run).

    Ids that end in a number ("req-7", "cmpl-12") step around the hue circle by the golden ratio, so
    consecutive requests get clearly different colours; the rest of the id picks the starting hue."""
    stem = request_id.rstrip("0123456789")
    number = int(request_id[len(stem):][-9:] or 0)
    hue = (zlib.crc32(stem.encode("utf-8")) / 2**32 + number * 0.618033988749895) % 1.0
    h = zlib.crc32(request_id.encode("utf-8"))  # saturation and value vary a little per id
    sat = 0.55 + 0.25 * ((h >> 8) & 0xFF) / 255.0
    val = 0.80 + 0.15 * ((h >> 16) & 0xFF) / 255.0
    return QColor.fromHsvF(hue, sat, val)


ADAPTER_PALETTE = ("#e15759", "#4e79a7", "#f28e2b", "#76b7b2", "#b07aa1", "#edc948", "#59a14f", "#ff9da7",
                   "#9c755f", "#2ca5d8", "#d4a6c8", "#86bcb6")
BASE_ADAPTER_COLOR = "#9aa0a6"  # requests on the base model
_adapter_colors: dict[str, str] = {}


def adapter_color(name: str | None) -> QColor:
    """One colour per LoRA adapter name, the same in every panel: the palette in the order names are
    first seen (distinct for the first 12), grey for the base model (None)."""
    if not name:
        return QColor(BASE_ADAPTER_COLOR)
    if name not in _adapter_colors:
        _adapter_colors[name] = ADAPTER_PALETTE[len(_adapter_colors) % len(ADAPTER_PALETTE)]
    return QColor(_adapter_colors[name])


def blend(a: QColor, b: QColor, t: float) -> QColor:
    """Linear mix: t=0 gives a, t=1 gives b."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * t,
        a.greenF() + (b.greenF() - a.greenF()) * t,
        a.blueF() + (b.blueF() - a.blueF()) * t,
    )


def make_palette(name: str) -> QPalette:
    if name not in _PALETTES:
        raise ValueError(f"theme must be one of {THEMES}, got {name!r}")
    c = {k: QColor(v) for k, v in _PALETTES[name].items()}
    pal = QPalette()
    role = QPalette.ColorRole
    for r, key in ((role.Window, "window"), (role.Base, "base"), (role.AlternateBase, "alt_base"),
                   (role.Button, "button"), (role.Highlight, "highlight"), (role.Mid, "mid"),
                   (role.ToolTipBase, "tooltip")):
        pal.setColor(r, c[key])
    for r in (role.WindowText, role.Text, role.ButtonText, role.ToolTipText, role.BrightText):
        pal.setColor(r, c["text"])
    pal.setColor(role.HighlightedText, QColor("#ffffff"))
    pal.setColor(role.PlaceholderText, c["disabled"])
    pal.setColor(role.Link, c["highlight"])
    dis = QPalette.ColorGroup.Disabled
    for r in (role.WindowText, role.Text, role.ButtonText):
        pal.setColor(dis, r, c["disabled"])
    return pal


def apply_theme(app: QApplication, name: str) -> None:
    """Set the application palette and pyqtgraph's defaults; every widget gets a PaletteChange."""
    pal = make_palette(name)
    app.setStyle("Fusion")
    app.setPalette(pal)
    pg.setConfigOptions(background=pal.color(QPalette.ColorRole.Base),
                        foreground=pal.color(QPalette.ColorRole.Text), antialias=True)


def style_plot(plot: pg.PlotWidget, palette: QPalette) -> None:
    """Restyle an existing plot (pyqtgraph's config options only affect plots created later)."""
    fg = palette.color(QPalette.ColorRole.Text)
    plot.setBackground(palette.color(QPalette.ColorRole.Base))
    item = plot.getPlotItem()
    for name in ("left", "bottom", "right", "top"):
        axis = item.getAxis(name)
        axis.setPen(pg.mkPen(palette.color(QPalette.ColorRole.Mid)))
        axis.setTextPen(pg.mkPen(fg))
    item.titleLabel.setText(item.titleLabel.text, color=fg)
    if item.legend is not None:
        item.legend.setLabelTextColor(fg)
