"""MemoryBar: one stacked horizontal bar of device memory by category (QPainter-drawn)."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from engine.events import MemorySnapshot
from widgets.fmt import human_bytes
from widgets.theme import MEMORY_CATEGORIES, MEMORY_LABELS, memory_color


def scaled_to_budget(snap: MemorySnapshot) -> bool:
    """On the CPU the engine's memory is a budget (weights + KV cache + workspace) inside the host's RAM:
    the bar spans that budget, or the weights would be 1 % of a 24 GiB machine and the lesson (the KV
    cache is what is left after the weights) invisible. On a GPU the bar spans the device."""
    return snap.source == "budget"


def memory_breakdown(snap: MemorySnapshot) -> dict[str, int]:
    """Bytes per category, in bar order. KV free = blocks neither used nor holding a cached prefix.
    Scaled to the budget (the CPU), the process's other memory and the host's free RAM are not in it. The
    captured CUDA graphs' pool has a share only where it is above 0 (a GPU with EngineConfig.cuda_graphs)."""
    kv_free_blocks = max(0, snap.kv_blocks_total - snap.kv_blocks_used - snap.kv_blocks_cached)
    parts = {
        "weights": snap.weights_bytes,
        "kv_used": snap.kv_blocks_used * snap.kv_block_bytes,
        "kv_cached": snap.kv_blocks_cached * snap.kv_block_bytes,
        "kv_free": kv_free_blocks * snap.kv_block_bytes,
        # a GPU: the peak a step may take, measured at start-up (what the KV cache left free for it)
        "activations": snap.activation_peak_bytes or snap.activation_bytes,
    }
    if snap.graphs_bytes:
        parts["graphs"] = snap.graphs_bytes
    if not scaled_to_budget(snap):
        parts.update(other=snap.other_bytes, free=snap.free_bytes)
    return parts


class MemoryBar(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._parts: dict[str, int] = {}
        self._total = 0
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(26)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(400, 30)

    def set_breakdown(self, parts: dict[str, int], total: int) -> None:
        """parts: bytes per category; total: the bar's full width in bytes (the device total)."""
        self._parts = dict(parts)
        self._total = max(total, sum(parts.values()))
        self.update()

    def total(self) -> int:
        return self._total

    def segment_rects(self) -> dict[str, QRect]:
        """Category -> its rectangle in widget coordinates (empty categories are left out)."""
        rects: dict[str, QRect] = {}
        if self._total <= 0:
            return rects
        inner = self.rect().adjusted(1, 1, -1, -1)
        acc = 0
        for cat in MEMORY_CATEGORIES:
            n = self._parts.get(cat, 0)
            if n <= 0:
                continue
            x0 = inner.left() + round(inner.width() * acc / self._total)
            acc += n
            x1 = inner.left() + round(inner.width() * acc / self._total)
            rects[cat] = QRect(x0, inner.top(), max(1, x1 - x0), inner.height())
        return rects

    def category_at(self, pos: QPoint) -> str | None:
        return next((c for c, r in self.segment_rects().items() if r.contains(pos)), None)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        for cat, r in self.segment_rects().items():
            p.fillRect(r, memory_color(cat, pal))
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.drawRect(self.rect().adjusted(0, 0, -1, -1))
        if self._total <= 0:
            p.setPen(pal.color(QPalette.ColorRole.Text))
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "no memory snapshot")

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            cat = self.category_at(event.pos())
            if cat is None:
                QToolTip.hideText()
            else:
                n = self._parts[cat]
                QToolTip.showText(event.globalPos(),
                                  f"{MEMORY_LABELS[cat]}: {human_bytes(n)} ({100 * n / self._total:.1f}%)", self)
            return True
        return super().event(event)
