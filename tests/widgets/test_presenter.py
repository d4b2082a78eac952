"""Presenter scale: plots grow for a projector and shrink back; the clipped-text check finds cut text."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QVBoxLayout

from widgets.panel_base import Panel
from widgets.presenter import TITLE_PT, clipped_texts


class _PlotPanel(Panel):
    def __init__(self) -> None:
        super().__init__()
        self.plot = pg.PlotWidget()
        self.item = self.plot.getPlotItem()
        self.item.setTitle("tokens per step")
        self.item.setLabel("left", "ms")
        self.item.addLegend()
        self.curve = self.item.plot([0, 1, 2], [1, 3, 2], pen=pg.mkPen("r", width=2), symbol="o", symbolSize=6,
                                    name="running")
        self.label = QLabel("time per output token")
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(self.plot)

    def reset(self) -> None:
        pass


def test_scale_grows_fonts_lines_markers_and_restores(qtbot):
    panel = _PlotPanel()
    qtbot.addWidget(panel)
    axis = panel.item.getAxis("left")
    panel.set_presenter_scale(2.0)
    assert axis.style["tickFont"].pointSizeF() > 0
    big_tick = axis.style["tickFont"].pointSizeF()
    assert panel.curve.opts["pen"].widthF() == 4.0
    assert panel.curve.opts["symbolSize"] == 12
    assert f"{TITLE_PT * 2:.1f}pt" in panel.item.titleLabel.opts["size"]
    assert not panel.item.legend.isVisible()  # its entries are chips under the title, outside the data
    assert "tokens per step<br>" in panel.item.titleLabel.text and "■" in panel.item.titleLabel.text
    assert panel.presenter_scale() == 2.0
    panel.set_presenter_scale(1.0)
    assert axis.style["tickFont"].pointSizeF() == big_tick / 2
    assert panel.curve.opts["pen"].widthF() == 2.0
    assert panel.curve.opts["symbolSize"] == 6
    # at scale 1 too the legend stays outside the data (issue 49: the timeline's box covered its bars)
    assert not panel.item.legend.isVisible() and panel.item.titleLabel.text.startswith("tokens per step<br>")
    assert f"{TITLE_PT:.1f}pt" in panel.item.titleLabel.opts["size"]


def test_legends_are_outside_the_data_from_the_first_showing(qtbot):
    panel = _PlotPanel()
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    item = panel.item
    assert not item.legend.isVisible() and "■" in item.titleLabel.text
    assert not item.titleLabel.sceneBoundingRect().intersects(item.vb.sceneBoundingRect())


def test_clipped_texts_finds_cut_labels_and_titles(qtbot):
    panel = _PlotPanel()
    qtbot.addWidget(panel)
    panel.resize(600, 400)
    panel.show()
    qtbot.waitExposed(panel)
    assert clipped_texts(panel) == []
    panel.label.setMaximumWidth(40)  # the text no longer fits its label
    panel.item.setTitle("a title far too long to fit in a plot of this width, whatever the font " * 2)
    qtbot.wait(10)
    found = clipped_texts(panel)
    assert any(f.startswith("label: time per output token") for f in found)
    assert any(f.startswith("plot title: a title far too long") for f in found)
    assert panel.clipped_texts() == found
