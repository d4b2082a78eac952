"""Presenter mode at a projector's size: every preset's panels enlarged, and no title or label cut."""
from __future__ import annotations

import pytest
from app_helpers import close_window, open_window, run_for, wait_until

from app.talk import presets
from widgets.presenter import clipped_texts


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_no_text_cut_in_presenter_mode(qapp, tiny_llama, size):
    w = open_window(tiny_llama, preset="continuous-batching")
    try:
        w.resize(*size)
        w.set_presenter(True, full_screen=False, screen_height=size[1])
        cut = {}
        for name in presets.available():
            assert w.controller.apply_preset(name), w.controller.last_error
            wait_until(qapp, lambda: w.controller.engine_ready, timeout_s=60)
            found_by_panel: dict = {}
            for _ in range(10):  # what the room sees once the layout has settled (a second or so)
                run_for(qapp, 0.3)
                w.flush_panels()
                run_for(qapp, 0.05)
                found_by_panel = {n: clipped_texts(w.panels.named(n)) for n in w._emphasised if w.docks[n].isVisible()}
                if not any(found_by_panel.values()):
                    break
            assert w.presenter
            need = w.minimumSizeHint()
            assert need.height() <= size[1], f"{name}: the panels need {need.height()} lines, the screen has {size[1]}"
            assert need.width() <= size[0], \
                f"{name}: the panels need {need.width()} px across, the screen has {size[0]}"
            for panel_name, found in found_by_panel.items():
                panel = w.panels.named(panel_name)
                assert not hasattr(panel, "presenter_scale") or panel.presenter_scale() > 1.0
                if found:
                    cut[f"{name}/{panel_name}"] = found
        assert cut == {}, "\n".join(f"{k}: {v}" for k, v in cut.items())
    finally:
        close_window(w)
