"""MemoryPanel: the device memory breakdown bar with its legend, and the KV block map."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from engine.events import BlockMapSnapshot, MemorySnapshot
from widgets.block_map import BlockMapView
from widgets.fmt import human_bytes
from widgets.memory_bar import MemoryBar, memory_breakdown, scaled_to_budget
from widgets.panel_base import Panel
from widgets.theme import MEMORY_CATEGORIES, MEMORY_LABELS, blend, free_block_color, memory_color

_SOURCE_NAMES = {"nvml": "NVML", "torch.cuda": "torch.cuda", "budget": "CPU budget"}
_LEGEND_COLUMNS = 2
_WIDE_LEGEND_PX = 560  # at least this wide, the legend takes three columns (one row less to wrap)


def _chip(color: str) -> str:
    return f"<span style='color:{color}; font-size:large'>■</span>"


class MemoryPanel(Panel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._memory: MemorySnapshot | None = None
        self._blocks: BlockMapSnapshot | None = None

        self._header = QLabel()
        self._header.setWordWrap(True)  # long headers wrap instead of widening the dock
        self._header.setTextFormat(Qt.TextFormat.RichText)
        self._bar = MemoryBar()
        self._legend_labels: dict[str, QLabel] = {}
        legend = self._legend_grid = QGridLayout()
        self._legend_columns = _LEGEND_COLUMNS
        legend.setHorizontalSpacing(16)
        legend.setVerticalSpacing(0)
        for i, cat in enumerate(MEMORY_CATEGORIES):
            label = QLabel()
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)  # growing numbers must not widen the dock
            self._legend_labels[cat] = label
            legend.addWidget(label, i // _LEGEND_COLUMNS, i % _LEGEND_COLUMNS)
        self._block_header = QLabel()
        self._block_header.setWordWrap(True)
        self._block_map = BlockMapView()
        self._block_legend = QLabel()
        self._block_legend.setTextFormat(Qt.TextFormat.RichText)
        self._block_legend.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.addWidget(self._header)
        layout.addWidget(self._bar)
        layout.addLayout(legend)
        layout.addSpacing(6)
        layout.addWidget(self._block_header)
        layout.addWidget(self._block_map, 1)
        layout.addWidget(self._block_legend)
        self.reset()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        columns = 3 if event.size().width() >= _WIDE_LEGEND_PX else _LEGEND_COLUMNS
        if columns != self._legend_columns:  # a wide dock (presenter mode): the legend's lines take less height
            self._legend_columns = columns
            for i, cat in enumerate(MEMORY_CATEGORIES):
                self._legend_grid.removeWidget(self._legend_labels[cat])
                self._legend_grid.addWidget(self._legend_labels[cat], i // columns, i % columns)
        super().resizeEvent(event)

    # --- setters ------------------------------------------------------------------------------
    def set_memory(self, snap: MemorySnapshot) -> None:
        self._memory = snap
        self._mark_dirty()

    def set_block_map(self, snap: BlockMapSnapshot) -> None:
        self._blocks = snap
        self._mark_dirty()

    def reset(self) -> None:
        self._memory = None
        self._blocks = None
        self._mark_dirty()
        self.flush()

    @property
    def block_map(self) -> BlockMapView:
        return self._block_map

    @property
    def bar(self) -> MemoryBar:
        return self._bar

    def snapshot_data(self) -> dict:
        data: dict = {"source": None, "device": None, "total_bytes": 0, "bytes": {}, "blocks": {}}
        if self._memory is not None:
            data.update(source=self._source_name(), device=self._memory.device,
                        total_bytes=self._bar.total(), bytes=memory_breakdown(self._memory))
        if self._blocks is not None:
            data["blocks"] = {**self._block_map.counts(), "block_size": self._blocks.block_size}
        data["header"] = self._header.text()
        return data

    # --- painting -----------------------------------------------------------------------------
    def _source_name(self) -> str:
        src = self._memory.source if self._memory else ""
        return _SOURCE_NAMES.get(src, src)

    def _repaint(self) -> None:
        self._update_overlay()
        self._repaint_memory()
        self._block_map.set_snapshot(self._blocks)
        self._repaint_block_header()
        self._repaint_block_legend()

    def _repaint_memory(self) -> None:
        snap = self._memory
        pal = self.palette()
        if snap is None:
            self._header.setText("<b>Device memory</b> — no snapshot yet")
            self._bar.set_breakdown({}, 0)
            for cat, label in self._legend_labels.items():
                # which device it is (CUDA graphs or not) comes with the first snapshot
                label.setVisible(cat != "graphs")
                label.setText(f"{_chip(memory_color(cat, pal).name())} {MEMORY_LABELS[cat]}")
            return
        parts = memory_breakdown(snap)
        budget = scaled_to_budget(snap)
        self._bar.set_breakdown(parts, sum(parts.values()) if budget else snap.device_total_bytes)
        total = self._bar.total()
        if budget:
            self._header.setText(
                f"<b>Engine memory</b> — {snap.device} · the bar is the engine's budget: weights + KV cache + "
                f"workspace = <b>{human_bytes(total)}</b> · host RAM {human_bytes(snap.free_bytes)} free of "
                f"{human_bytes(snap.device_total_bytes)}, the process's other memory "
                f"{human_bytes(snap.other_bytes)} (not in the bar)")
        else:
            unaccounted = total - sum(parts.values())
            note = f" · unaccounted {human_bytes(unaccounted)}" if unaccounted > 0.01 * total else ""
            self._header.setText(f"<b>Device memory</b> — {snap.device} · source: <b>{self._source_name()}</b>"
                                 f" · total {human_bytes(total)}{note}")
        for cat, label in self._legend_labels.items():
            label.setVisible(cat in parts)
            if cat not in parts:
                continue
            n = parts[cat]
            pct = 100 * n / total if total else 0.0
            packed = (f", of which {human_bytes(snap.packed_weights_bytes)} a oneDNN-packed copy"
                      if cat == "weights" and snap.packed_weights_bytes else "")
            label.setText(f"{_chip(memory_color(cat, pal).name())} {MEMORY_LABELS[cat]}: "
                          f"<b>{human_bytes(n)}</b> ({pct:.1f}%{packed})")

    def _repaint_block_header(self) -> None:
        if self._blocks is None:
            self._block_header.setText("KV block map — no snapshot yet")
            return
        c = self._block_map.counts()
        text = f"KV blocks: {c['total']} × {self._blocks.block_size} tokens"
        if self._memory is not None and self._memory.kv_block_bytes:
            per_token = self._memory.kv_block_bytes / max(1, self._blocks.block_size)
            text += f" · {human_bytes(self._memory.kv_block_bytes)}/block ({human_bytes(per_token)}/token)"
        text += (f" · used {c['used']} · cached {c['cached']} · shared {c['shared']} · free {c['free']}"
                 f" · {c['requests']} requests")
        self._block_header.setText(text)

    def _repaint_block_legend(self) -> None:
        pal = self.palette()
        cached = blend(memory_color("kv_cached", pal), pal.color(pal.ColorRole.Base), 0.6).name()
        self._block_legend.setText(
            f"{_chip('#4e79a7')}{_chip('#f28e2b')}{_chip('#59a14f')} in use (colour = request) &nbsp; "
            f"<b>●</b> shared (ref count &gt; 1) &nbsp; {_chip(cached)} cached prefix (reusable) &nbsp; "
            f"{_chip(free_block_color(pal).name())} free &nbsp; <i>hover a block: owners</i>")

    def _on_palette_changed(self) -> None:
        self._mark_dirty()
