"""BlockMapView: every KV block is one cell, coloured by the request that owns it.

in use          the owner's colour (stable per request id, shared with the Gantt chart)
shared          ref_count > 1: a white dot in the cell (or a whitened cell when cells are tiny)
cached          ref_count == 0 but holding a reusable prefix: dimmed
free            grey

The grid image is built with numpy (one uint32 per block, repeated to cell size) only when the
snapshot or the widget size changes, so thousands of blocks cost one QImage blit per paint.
Hovering a block outlines every block of its owner (its block table).
"""
from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QEvent, QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from engine.events import BlockInfo, BlockMapSnapshot
from widgets.hover_tips import HoverTips
from widgets.theme import blend, free_block_color, memory_color, request_color

_MIN_CELL_FOR_GAP = 5
_MIN_CELL_FOR_DOT = 6
_CACHED_DIM = 0.6  # how far a cached block's colour is pulled towards the background


def grid_layout(num_blocks: int, width: int, height: int) -> tuple[int, int]:
    """(cell size px, columns): the largest square cells such that all blocks fit in width×height."""
    if num_blocks <= 0 or width <= 0 or height <= 0:
        return 1, max(1, width)
    cell = max(1, min(width, height, int(math.sqrt(width * height / num_blocks))))
    while cell > 1 and math.ceil(num_blocks / max(1, width // cell)) * cell > height:
        cell -= 1
    return cell, max(1, width // cell)


class BlockMapView(HoverTips, QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._snap: BlockMapSnapshot | None = None
        self._infos: dict[int, BlockInfo] = {}
        self._image: QImage | None = None
        self._cell, self._cols = 1, 1
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumSize(120, 60)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(400, 200)

    # --- data ---------------------------------------------------------------------------------
    def set_snapshot(self, snap: BlockMapSnapshot | None) -> None:
        self._snap = snap
        self._infos = {b.block_id: b for b in snap.blocks} if snap else {}
        self._image = None  # rebuilt on the next paint
        self.update()

    def counts(self) -> dict[str, int]:
        infos = self._infos.values()
        n = self._snap.num_blocks if self._snap else 0
        used = sum(1 for b in infos if b.ref_count > 0)
        cached = sum(1 for b in infos if b.ref_count == 0 and b.cached)
        return {"total": n, "used": used, "cached": cached, "free": n - used - cached,
                "shared": sum(1 for b in infos if b.ref_count > 1),
                "requests": len(self._snap.block_tables) if self._snap else 0}

    def block_color(self, info: BlockInfo | None) -> QColor:
        pal = self.palette()
        if info is None or (info.ref_count == 0 and not info.cached):
            return free_block_color(pal)
        if info.ref_count == 0:  # cached, reusable prefix: dimmed
            return blend(memory_color("kv_cached", pal), pal.color(QPalette.ColorRole.Base), _CACHED_DIM)
        return request_color(info.owners[0]) if info.owners else memory_color("kv_used", pal)

    # --- geometry -----------------------------------------------------------------------------
    def block_rect(self, block_id: int) -> QRect:
        self._ensure_layout()
        gap = 1 if self._cell >= _MIN_CELL_FOR_GAP else 0
        row, col = divmod(block_id, self._cols)
        return QRect(col * self._cell, row * self._cell, self._cell - gap, self._cell - gap)

    def block_at(self, pos: QPoint) -> int | None:
        if self._snap is None:
            return None
        self._ensure_layout()
        col, row = pos.x() // self._cell, pos.y() // self._cell
        block_id = row * self._cols + col
        return block_id if 0 <= col < self._cols and 0 <= block_id < self._snap.num_blocks else None

    def tooltip_at(self, pos: QPoint) -> str:
        block_id = self.block_at(pos)
        if block_id is None:
            return ""
        info = self._infos.get(block_id)
        if info is None:
            return f"block {block_id}\nfree"
        owners = ", ".join(info.owners) if info.owners else "none"
        shared = " · shared" if info.ref_count > 1 else ""
        cached = "yes (reusable prefix)" if info.cached else "no"
        return f"block {block_id}\nowners: {owners}\nref count {info.ref_count}{shared}\ncached: {cached}"

    def _ensure_layout(self) -> None:
        n = self._snap.num_blocks if self._snap else 0
        self._cell, self._cols = grid_layout(n, self.width(), self.height())

    # --- painting -----------------------------------------------------------------------------
    def _build_image(self) -> QImage:
        self._ensure_layout()
        n, cell, cols = self._snap.num_blocks, self._cell, self._cols
        rows = math.ceil(n / cols)
        bg = self.palette().color(QPalette.ColorRole.Base).rgba()
        colors = np.full(rows * cols, bg, dtype=np.uint32)
        colors[:n] = self.block_color(None).rgba()
        for info in self._infos.values():
            if 0 <= info.block_id < n:
                colors[info.block_id] = self.block_color(info).rgba()
        pixels = np.repeat(np.repeat(colors.reshape(rows, cols), cell, axis=0), cell, axis=1)
        if cell >= _MIN_CELL_FOR_GAP:
            pixels[cell - 1::cell, :] = bg
            pixels[:, cell - 1::cell] = bg
        pixels = np.ascontiguousarray(pixels)
        h, w = pixels.shape
        image = QImage(pixels.data, w, h, w * 4, QImage.Format.Format_ARGB32).copy()
        self._mark_shared(image)
        return image

    def _mark_shared(self, image: QImage) -> None:
        p = QPainter(image)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        for info in self._infos.values():
            if info.ref_count > 1 and info.block_id < self._snap.num_blocks:
                r = QRectF(self.block_rect(info.block_id))
                if self._cell >= _MIN_CELL_FOR_DOT:
                    radius = max(1.5, self._cell * 0.2)
                    p.setBrush(QColor("white"))
                    p.drawEllipse(r.center(), radius, radius)
                else:
                    p.fillRect(r, blend(self.block_color(info), QColor("white"), 0.6))
        p.end()

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        if self._snap is None or self._snap.num_blocks == 0:
            p.setPen(pal.color(QPalette.ColorRole.Text))
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "no KV blocks yet")
            return
        if self._image is None:
            self._image = self._build_image()
        p.drawImage(0, 0, self._image)
        table = self._snap.block_tables.get(self._hover or "", ())
        if table:
            p.setPen(QPen(pal.color(QPalette.ColorRole.Text), 1))
            p.setBrush(Qt.BrushStyle.NoBrush)
            for block_id in table:
                p.drawRect(self.block_rect(block_id).adjusted(0, 0, -1, -1))

    # --- events -------------------------------------------------------------------------------
    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self._image = None
        super().resizeEvent(event)

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.PaletteChange:
            self._image = None
        super().changeEvent(event)

    def hover_key(self, pos) -> str | None:
        """The request owning the block under the mouse: all its blocks get outlined."""
        block_id = self.block_at(pos.toPoint())
        info = self._infos.get(block_id) if block_id is not None else None
        return info.owners[0] if info and info.owners else None
