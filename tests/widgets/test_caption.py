from __future__ import annotations

from widgets.caption import CaptionBanner


def test_caption_and_presenter_mode(qtbot):
    banner = CaptionBanner()
    qtbot.addWidget(banner)
    banner.show()
    assert not banner._title.isVisible()  # nothing to say yet
    banner.set_caption("KV cache", "Every token's keys and values live in 16-token blocks.")
    assert banner._title.isVisible() and banner._caption.isVisible()
    normal = banner._title.font().pointSizeF()
    banner.set_presenter(True)
    assert banner._title.font().pointSizeF() > normal
    assert banner.snapshot_data() == {"title": "KV cache", "presenter": True, "cue": "",
                                      "caption": "Every token's keys and values live in 16-token blocks."}
    banner.set_cue("a burst of long prompts")  # a preset's cue: shown under the caption
    assert banner.snapshot_data()["cue"] == "▶ a burst of long prompts" and banner._cue.isVisibleTo(banner)
    banner.set_presenter(True, screen_height=720)  # a 720-line projector: the caption leaves the charts room
    assert normal < banner._title.font().pointSizeF() < 24.0
    banner.reset()
    assert banner.snapshot_data()["title"] == ""
