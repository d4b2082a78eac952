"""TimelinePanel: what each engine step did, and a per-request Gantt chart underneath.

Top plot: tokens per step stacked as prefill / decode / verify, with preemptions (×) and admission
rejections (▲) as markers and configuration changes as labelled vertical lines.
Middle plots: running and waiting request counts; the wall time of each step (what compilation,
quantization or a bigger batch change), with its median over the last steps in the title; a few
stalls far above the rest (a compile) are drawn as markers at the top instead of setting the scale.
x is the step index; the last `max_steps` steps are kept in a ring buffer.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from engine.events import StepStats
from widgets.gantt import GanttView
from widgets.line_labels import place_line_labels
from widgets.panel_base import Panel
from widgets.theme import phase_color, style_plot

DEFAULT_MAX_STEPS = 600
_PHASES = ("prefill", "decode", "verify")
_HEADROOM = 1.3
_MEDIAN_OF = 50  # steps behind the step-time plot's median
# where a new config change's label starts on its line (share of the plot), successive marks apart; the next
# repaint places every label for good (widgets/line_labels.py)
MARK_LABEL_HEIGHTS = (0.9, 0.68, 0.46, 0.24)


def _fill_curve(plot: pg.PlotItem, phase: str) -> pg.PlotDataItem:
    color = phase_color(phase)
    return plot.plot([0.0], [], stepMode="center", fillLevel=0, brush=color,
                     pen=pg.mkPen(color, width=1), name=phase)


def step_time_ceiling(ms: np.ndarray) -> float:
    """The step-time plot's top: the longest step, unless a few stalls (a compile, one huge prefill) stand
    far above the rest; then 3x the 90th percentile, and those steps are marked at the top instead."""
    top = max(1.0, float(ms.max()))
    typical = float(np.percentile(ms, 90)) if len(ms) >= 10 else top
    return top if top <= 3 * typical else max(1.0, 3 * typical)


class TimelinePanel(Panel):
    def __init__(self, parent: QWidget | None = None, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        super().__init__(parent)
        self._steps: deque[StepStats] = deque(maxlen=max_steps)
        self._marks: deque[tuple[int, str, tuple[pg.InfiniteLine, ...]]] = deque()

        self._tokens_plot = pg.PlotWidget()
        # the cue labels are placed for the plot's size: placed again when it changes (a title re-fitted)
        self._tokens_plot.getPlotItem().vb.sigResized.connect(lambda *_: self._place_mark_labels())
        self._queue_plot = pg.PlotWidget()
        self._time_plot = pg.PlotWidget()
        tp, qp, wp = (w.getPlotItem() for w in (self._tokens_plot, self._queue_plot, self._time_plot))
        tp.setTitle("tokens per step")
        tp.addLegend(offset=(-5, 5), colCount=5, brush=pg.mkBrush(128, 128, 128, 60))
        qp.addLegend(offset=(-5, 5), colCount=2, brush=pg.mkBrush(128, 128, 128, 60))
        qp.setXLink(tp)
        wp.setXLink(tp)
        wp.setLabel("bottom", "engine step")
        # the title says the unit ("step time: last 12 ms · ..."): no y label to squeeze a short plot
        tp.hideAxis("bottom")  # x is shared: only the lowest plot labels the steps (and repaints ticks)
        qp.hideAxis("bottom")
        for p in (tp, qp, wp):
            p.showGrid(x=False, y=True, alpha=0.25)
            p.setMouseEnabled(x=False, y=False)
            p.hideButtons()
        # drawn back to front: each curve is the cumulative top of its phase, filled down to 0
        self._fills = {ph: _fill_curve(tp, ph) for ph in reversed(_PHASES)}
        self._preempt = pg.ScatterPlotItem(symbol="x", size=10, pen=pg.mkPen(phase_color("preempted"), width=2),
                                           brush=phase_color("preempted"), name="preempted")
        self._reject = pg.ScatterPlotItem(symbol="t1", size=10, pen=None, brush=phase_color("rejected"),
                                          name="rejected")
        tp.addItem(self._preempt)
        tp.addItem(self._reject)
        self._running = qp.plot([], [], pen=pg.mkPen(phase_color("running"), width=2), name="running")
        self._waiting = qp.plot([], [], pen=pg.mkPen(phase_color("waiting"), width=2), name="waiting")
        self._step_ms = wp.plot([], [], pen=pg.mkPen(phase_color("decode"), width=1.5))
        # steps above the plot's scale, drawn above its top as grey arrows (seen on the clipped spikes and on
        # either theme): not the triangles of the "rejected" marker above (a viewer read them as rejections)
        self._stalls = pg.ScatterPlotItem(symbol="arrow_up", size=18, pen=pg.mkPen(phase_color("queued"), width=1.5),
                                          brush=phase_color("queued"))
        wp.addItem(self._stalls)

        self._gantt = GanttView()
        self._gantt_label = QLabel()
        self._gantt_label.setWordWrap(True)  # a long legend wraps instead of widening the panel
        self._gantt_label.setTextFormat(Qt.TextFormat.RichText)
        gantt_box = QWidget()
        gl = QVBoxLayout(gantt_box)
        gl.setContentsMargins(0, 0, 0, 0)
        gl.addWidget(self._gantt_label)
        gl.addWidget(self._gantt, 1)
        self._steps_note = QLabel()  # replaces the step plots for a source without step events
        self._steps_note.setWordWrap(True)
        self._steps_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._steps_note.hide()
        self._gantt_legend_html: str | None = None
        splitter = QSplitter(Qt.Orientation.Vertical)
        for w, stretch in ((self._steps_note, 1), (self._tokens_plot, 3), (self._queue_plot, 2), (self._time_plot, 2),
                           (gantt_box, 3)):
            splitter.addWidget(w)
            splitter.setStretchFactor(splitter.count() - 1, stretch)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(splitter)
        self._update_gantt_legend()
        self._on_palette_changed()

    # --- setters ------------------------------------------------------------------------------
    def add_step(self, stats: StepStats) -> None:
        self._steps.append(stats)
        self._gantt.add_step(stats)
        self._mark_dirty()

    def request_arrived(self, request_id: str, t: float) -> None:
        self._gantt.request_arrived(request_id, t)
        self._mark_dirty()

    def request_preempted(self, request_id: str, t: float) -> None:
        self._gantt.request_preempted(request_id, t)
        self._mark_dirty()

    def request_finished(self, request_id: str, t: float, reason: str | None) -> None:
        self._gantt.request_finished(request_id, t, reason)
        self._mark_dirty()

    def request_span(self, request_id: str, t0: float, t1: float, kind: str) -> None:
        """A request's span measured outside the engine (an attached server's stream)."""
        self._gantt.add_span(request_id, t0, t1, kind)
        self._mark_dirty()

    def set_steps_note(self, text: str, gantt_legend: str | None = None) -> None:
        """A source without per-step events: the step plots give way to `text` (what is not exposed), the
        Gantt chart stays, with its own legend; "" brings the step plots back."""
        for w in (self._tokens_plot, self._queue_plot, self._time_plot):
            w.setVisible(not text)
        self._steps_note.setText(text)
        self._steps_note.setVisible(bool(text))
        self._gantt_legend_html = gantt_legend if text else None
        self._update_gantt_legend()

    def steps_note(self) -> str:
        return self._steps_note.text()

    def mark_config_change(self, text: str) -> None:
        """A labelled vertical line after the latest step (e.g. "max_num_seqs 8 → 32")."""
        x = (self._steps[-1].step + 0.5) if self._steps else 0.0
        # successive marks put their labels at different heights: two close together do not print over each other
        height = MARK_LABEL_HEIGHTS[len(self._marks) % len(MARK_LABEL_HEIGHTS)]
        lines = (pg.InfiniteLine(pos=x, angle=90, label=text,
                                 labelOpts={"position": height, "anchors": [(0, 0), (0, 0)]}),
                 pg.InfiniteLine(pos=x, angle=90), pg.InfiniteLine(pos=x, angle=90))
        self._style_mark(lines)
        for plot, line in zip(self._plots(), lines, strict=True):
            plot.addItem(line)
        self._marks.append((int(x), text, lines))
        self._mark_dirty()

    def set_presenter_scale(self, scale: float) -> None:
        """Larger text needs taller plots: each keeps a readable height (the Gantt chart gives way)."""
        super().set_presenter_scale(scale)
        for widget, base in ((self._tokens_plot, 45), (self._queue_plot, 35), (self._time_plot, 70)):
            widget.setMinimumHeight(int(base * scale) if scale > 1 else 0)

    def set_gantt_window(self, seconds: float) -> None:
        self._gantt.set_window(seconds)

    def reset(self) -> None:
        self._steps.clear()
        while self._marks:
            self._drop_oldest_mark()
        self._gantt.reset()
        self._mark_dirty()
        self.flush()

    @property
    def gantt(self) -> GanttView:
        return self._gantt

    def snapshot_data(self) -> dict:
        steps = list(self._steps)
        last = steps[-1] if steps else None
        return {
            "num_steps": len(steps), "first_step": steps[0].step if steps else None,
            "last_step": last.step if last else None,
            "last": None if last is None else {
                "prefill": last.num_prefill_tokens, "decode": last.num_decode_tokens,
                "verify": last.num_verify_tokens, "running": last.num_running, "waiting": last.num_waiting},
            "num_preemption_markers": sum(1 for s in steps if s.num_preempted),
            "num_rejection_markers": sum(1 for s in steps if s.num_rejected),
            "config_changes": [text for _x, text, _lines in self._marks],
            "step_ms": None if last is None else last.wall_time_s * 1e3,
            "gantt": self._gantt.snapshot_data(),
        }

    # --- painting -----------------------------------------------------------------------------
    def _repaint(self) -> None:
        self._drop_scrolled_marks()
        self._gantt.update()
        if not self._steps:
            for fill in self._fills.values():
                fill.setData([0.0], [])  # step mode: one more edge than values
            for item in (self._running, self._waiting, self._preempt, self._reject, self._step_ms, self._stalls):
                item.setData([], [])
            for plot in self._plots():
                plot.setYRange(0, 1, padding=0)
            self._time_plot.setTitle("step time (ms)")
            return
        a = np.array([(s.step, s.num_prefill_tokens, s.num_decode_tokens, s.num_verify_tokens,
                       s.num_running, s.num_waiting, s.num_preempted, s.num_rejected, s.wall_time_s * 1e3)
                      for s in self._steps],
                     dtype=np.float64)
        x = a[:, 0]
        edges = np.append(x - 0.5, x[-1] + 0.5)
        top = np.zeros(len(x))
        for i, ph in enumerate(_PHASES):
            top = top + a[:, 1 + i]
            self._fills[ph].setData(edges, top.copy())
        self._running.setData(x, a[:, 4])
        self._waiting.setData(x, a[:, 5])
        pre, rej = a[:, 6] > 0, a[:, 7] > 0
        bump = max(1.0, top.max() * 0.04)
        self._preempt.setData(x[pre], top[pre] + bump)
        self._reject.setData(x[rej], top[rej] + 2 * bump)
        # headroom above the data keeps the legend from covering it
        self._tokens_plot.setYRange(0, max(1.0, top.max() + 2 * bump) * _HEADROOM, padding=0)
        self._queue_plot.setYRange(0, max(1.0, a[:, 4].max(), a[:, 5].max()) * _HEADROOM, padding=0)
        ms = a[:, 8]
        ceiling = step_time_ceiling(ms)
        off = ms > ceiling  # a stall (compiling, a long prefill) would flatten every other step: off the scale
        self._step_ms.setData(x, np.minimum(ms, ceiling))
        self._stalls.setData(x[off], np.full(int(off.sum()), ceiling * 1.08))
        self._time_plot.setYRange(0, ceiling * 1.2, padding=0)
        stalls = f" · {int(off.sum())} off the scale ↑ (longest {ms.max() / 1e3:.1f} s)" if off.any() else ""
        self._time_plot.setTitle(f"step time: last {ms[-1]:.0f} ms · median {np.median(ms[-_MEDIAN_OF:]):.0f} ms "
                                 f"({min(len(ms), _MEDIAN_OF)} steps){stalls}")
        self._place_mark_labels()

    def _place_mark_labels(self) -> None:
        """Each cue's label inside the plot, apart from the others (widgets/line_labels.py)."""
        plot = self._tokens_plot.getPlotItem()
        legend = plot.legend  # inside the data at scale 1 (presenter mode makes it a line above the plot)
        avoid = [legend.sceneBoundingRect()] if legend is not None and legend.isVisible() else []
        place_line_labels(plot.vb, [(x, lines[0].label, text) for x, text, lines in self._marks], avoid)

    def _drop_scrolled_marks(self) -> None:
        if not self._steps:
            return
        while self._marks and self._marks[0][0] < self._steps[0].step - 1:
            self._drop_oldest_mark()

    def _drop_oldest_mark(self) -> None:
        _x, _text, lines = self._marks.popleft()
        for plot, line in zip(self._plots(), lines, strict=True):
            plot.removeItem(line)

    def _plots(self) -> tuple[pg.PlotWidget, ...]:
        return self._tokens_plot, self._queue_plot, self._time_plot

    def _update_gantt_legend(self) -> None:
        if self._gantt_legend_html:
            self._gantt_label.setText(self._gantt_legend_html)
            return
        chips = " ".join(f"<span style='color:{phase_color(k).name()}'>■</span> {k}"
                         for k in ("queued", "prefill", "decode", "verify", "preempted"))
        self._gantt_label.setText(f"<b>requests</b> (last seconds, newest at the bottom) &nbsp; {chips}"
                                  " &nbsp; | finished")

    def _style_mark(self, lines: tuple[pg.InfiniteLine, ...]) -> None:
        fg = self.palette().color(self.palette().ColorRole.Text)
        pen = pg.mkPen(fg, width=1, style=Qt.PenStyle.DashLine)
        for line in lines:
            line.setPen(pen)
        lines[0].label.setColor(fg)

    def _on_palette_changed(self) -> None:
        for plot in self._plots():
            style_plot(plot, self.palette())
        for _x, _text, lines in self._marks:
            self._style_mark(lines)
