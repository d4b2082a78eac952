"""Render every panel with synthetic data into one window and save PNGs in both themes.

    QT_QPA_PLATFORM=offscreen python tests/widgets/render_demo.py [OUT_DIR]

Writes OUT_DIR/demo_{dark,light}.png (the whole window), demo_{dark,light}_empty.png (every panel
before any data: the off / empty states) and OUT_DIR/{theme}_{panel}.png.
Not collected by pytest (the name does not start with test_).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parents[1]), str(_HERE)]

import widget_fakes as fakes  # noqa: E402
from PySide6.QtWidgets import QApplication, QGridLayout, QWidget  # noqa: E402

from engine.events import TokenSource  # noqa: E402
from widgets import (  # noqa: E402
    CaptionBanner,
    ControlsPanel,
    LatencyPanel,
    MemoryPanel,
    SpecPanel,
    TimelinePanel,
    TokenStreamPanel,
    TradeoffPanel,
    apply_theme,
)

ANSWER = [("The", TokenSource.DECODED), (" quick", TokenSource.DECODED), (" brown", TokenSource.ACCEPTED),
          (" fox", TokenSource.ACCEPTED), (" leaps", TokenSource.CORRECTED), (" over", TokenSource.BONUS),
          (" the", TokenSource.DECODED), (" lazy", TokenSource.ACCEPTED), (" dog", TokenSource.ACCEPTED),
          (".", TokenSource.CORRECTED), (" Paged", TokenSource.DECODED), (" attention", TokenSource.DECODED),
          (" stores", TokenSource.DECODED), (" keys", TokenSource.ACCEPTED), (" and", TokenSource.BONUS),
          (" values", TokenSource.DECODED), (" in", TokenSource.DECODED), (" blocks", TokenSource.DECODED)]


def build_window() -> tuple[QWidget, dict[str, QWidget]]:
    panels = {"caption": CaptionBanner(), "controls": ControlsPanel(), "tokens": TokenStreamPanel(),
              "memory": MemoryPanel(), "timeline": TimelinePanel(), "spec": SpecPanel(),
              "latency": LatencyPanel(), "tradeoff": TradeoffPanel()}
    window = QWidget()
    grid = QGridLayout(window)
    grid.addWidget(panels["caption"], 0, 0, 1, 4)
    grid.addWidget(panels["controls"], 1, 0)
    grid.addWidget(panels["tokens"], 1, 1)
    grid.addWidget(panels["memory"], 1, 2)
    grid.addWidget(panels["timeline"], 1, 3, 2, 1)
    grid.addWidget(panels["spec"], 2, 0)
    grid.addWidget(panels["latency"], 2, 1)
    grid.addWidget(panels["tradeoff"], 2, 2)
    for col in range(4):
        grid.setColumnStretch(col, 1)
    grid.setRowStretch(1, 1)
    grid.setRowStretch(2, 1)
    return window, panels


def feed(panels: dict[str, QWidget]) -> None:
    panels["caption"].set_caption("Speculative decoding", "A cheap n-gram drafter proposes 4 tokens; the model "
                                  "verifies them in one pass. Green tokens were accepted drafts.")
    panels["controls"].set_busy("requantizing to 4-bit…", 0.4)
    panels["controls"].set_feature_available("quant_format", False, "quantization is not implemented yet")
    tokens = panels["tokens"]
    tokens.add_stream("req-1", "Second request")
    tokens.add_stream("req-0", "Tell me a story", prompt="Tell me a story about a fox.")
    so_far: tuple[int, ...] = ()
    for i, (text, src) in enumerate(ANSWER):
        out = fakes.token_output("req-0", [100 + i], [text], [src], so_far=so_far)
        so_far = out.token_ids
        tokens.append_output(out)
    tokens.set_stream_timing("req-0", 0.142, 37.5)
    panels["memory"].set_memory(fakes.memory_snapshot())
    panels["memory"].set_block_map(fakes.block_map())
    sim = fakes.TrafficSim(seed=1)
    timeline, latency = panels["timeline"], panels["latency"]
    for i in range(400):
        stats = sim.next_step()
        for rid, t in sim.arrivals:
            timeline.request_arrived(rid, t)
        sim.arrivals.clear()
        timeline.add_step(stats)
        latency.add_step(stats)
        for rid, t, reason in sim.finished:
            timeline.request_finished(rid, t, reason)
        sim.finished.clear()
        if i == 200:
            timeline.mark_config_change("max_num_seqs 8 → 16")
    for tl in sim.timelines:
        latency.add_finished(tl)
    latency.set_budget(0.5, 0.05)
    for step in range(150):
        panels["spec"].add_spec_stats(fakes.spec_stats(step))
    panels["spec"].set_measured_speedup(1.7)
    for p in fakes.tradeoff_points():
        panels["tradeoff"].add_point(p)
    panels["tradeoff"].set_current("bits=8 batch=32")


def main(out_dir: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    window, panels = build_window()
    feed(panels)
    empty_window, _empty_panels = build_window()  # the "no data yet / off" states
    paths = []
    for w in (window, empty_window):
        w.resize(2000, 1150)
        w.show()
    for theme in ("dark", "light"):
        apply_theme(app, theme)
        app.processEvents()
        for p in (*panels.values(), *_empty_panels.values()):
            if hasattr(p, "flush"):
                p.flush()
        app.processEvents()
        for w, suffix in ((window, ""), (empty_window, "_empty")):
            path = out / f"demo_{theme}{suffix}.png"
            w.grab().save(str(path))
            paths.append(path)
        for name, p in panels.items():
            p.grab().save(str(out / f"{theme}_{name}.png"))
    return paths


if __name__ == "__main__":
    for p in main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/inferlab_render"):
        print(p)
