"""TokenStreamPanel: buffered streaming, provenance colours, per-token tooltips, prompt submission."""
from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QHelpEvent, QTextCursor
from PySide6.QtWidgets import QApplication, QToolTip
from widget_fakes import token_output

from engine.events import TokenSource
from widgets.theme import token_color
from widgets.token_stream import TokenStreamPanel

WORDS = ["Hello", " world", ",", " how", " are", " you"]
SOURCES = [TokenSource.DECODED, TokenSource.ACCEPTED, TokenSource.ACCEPTED, TokenSource.CORRECTED,
           TokenSource.BONUS, TokenSource.DECODED]


@pytest.fixture
def panel(show):
    return show(TokenStreamPanel())


def _stream(panel, rid="r1", logprobs=True):
    panel.add_stream(rid, "first prompt")
    so_far: tuple[int, ...] = ()
    for i, (word, src) in enumerate(zip(WORDS, SOURCES)):
        out = token_output(rid, [100 + i], [word], [src], logprobs=logprobs, so_far=so_far,
                           finished=i == len(WORDS) - 1)
        so_far = out.token_ids
        panel.append_output(out)


def _centre(view, index):
    return view.segment_rect(index).center()


def test_tokens_are_buffered_until_the_repaint(panel):
    _stream(panel)
    view = panel.view("r1")
    assert view.toPlainText() == ""  # nothing painted per token
    panel.flush()
    assert view.toPlainText() == "Hello world, how are you"
    snap = panel.snapshot_data()["streams"]["r1"]
    assert snap["num_tokens"] == 6 and snap["num_segments"] == 6 and snap["finished"]
    assert snap["sources"] == {"decoded": 2, "accepted": 2, "corrected": 1, "bonus": 1}


def test_tooltip_shows_token_id_logprob_and_alternatives(panel):
    _stream(panel)
    panel.flush()
    view = panel.view("r1")
    tip = view.tooltip_at(_centre(view, 1))  # " world": token 101, logprob -0.1
    assert "token id 101" in tip and "accepted draft" in tip
    assert "logprob -0.100 (p = 0.905)" in tip and "' alt' -2.500" in tip
    # a real hover goes through the same text into QToolTip
    pos = _centre(view, 3)
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, pos, view.viewport().mapToGlobal(pos)))
    assert "token id 103" in QToolTip.text()
    assert view.tooltip_at(QPoint(5, view.viewport().height() - 3)) == ""  # empty space: no tooltip


def test_tooltip_says_logprobs_off(panel):
    _stream(panel, logprobs=False)
    panel.flush()
    view = panel.view("r1")
    tip = view.tooltip_at(_centre(view, 0))
    assert "token id 100" in tip and "logprobs off" in tip


def test_tokens_coloured_by_source_with_alternating_background(panel):
    _stream(panel)
    panel.flush()
    view = panel.view("r1")
    cursor = QTextCursor(view.document())
    formats = []
    for start in (1, 6, 14):  # inside "Hello", " world", " how"
        cursor.setPosition(start)
        formats.append(cursor.charFormat())
    assert formats[0].foreground().color() == token_color(TokenSource.DECODED, view.palette())
    assert formats[1].foreground().color() == token_color(TokenSource.ACCEPTED, view.palette())
    assert formats[2].foreground().color() == token_color(TokenSource.CORRECTED, view.palette())
    assert formats[0].background().style() == Qt.BrushStyle.NoBrush  # even token: clear
    assert formats[1].background().style() != Qt.BrushStyle.NoBrush  # odd token: shaded


def test_multi_token_step_split_by_decoder_or_kept_together(panel):
    out = token_output("r1", [7, 8, 9], [" a", " b", " c"], [TokenSource.ACCEPTED, TokenSource.ACCEPTED,
                                                            TokenSource.BONUS])
    panel.append_output(out)
    panel.flush()
    view = panel.view("r1")
    assert len(view.segments()) == 1  # no decoder: one segment, no invented boundaries
    assert "3 tokens" in view.tooltip_at(_centre(view, 0))
    panel.set_token_decoder({7: " a", 8: " b", 9: " c"}.__getitem__)
    panel.append_output(token_output("r1", [7, 8, 9], [" a", " b", " c"]))
    panel.flush()
    assert len(view.segments()) == 4


def test_multi_token_step_split_by_the_engines_pieces(panel):
    """The engine sends each new token's text with a multi-token step: no decoder needed in the GUI."""
    out = replace(token_output("r2", [7, 8, 9], [" a", " b", " c"]), new_token_pieces=(" a", " b", " c"))
    panel.append_output(out)
    panel.flush()
    assert [seg.text for seg in panel.view("r2").segments()] == [" a", " b", " c"]


def test_held_back_text_joins_the_next_segment(panel):
    panel.append_output(token_output("r1", [1], [""]))  # e.g. half a UTF-8 character
    panel.append_output(token_output("r1", [2], ["é"]))
    panel.flush()
    segs = panel.view("r1").segments()
    assert len(segs) == 1 and [t.token_id for t in segs[0].tokens] == [1, 2]


def test_several_streams_as_tabs_with_timing(panel):
    _stream(panel, "r1")
    _stream(panel, "r2")
    panel.set_stream_timing("r1", 0.142, 37.5)
    panel.flush()
    data = panel.snapshot_data()
    assert data["num_streams"] == 2 and data["current"] == "r2"
    assert data["streams"]["r1"]["status"].startswith("TTFT 142 ms · 37.5 tok/s · 6 tokens")
    panel.reset()
    assert panel.snapshot_data()["num_streams"] == 0


def test_oldest_finished_stream_is_dropped_beyond_the_limit(show):
    panel = show(TokenStreamPanel(max_streams=2))
    _stream(panel, "a")
    panel.add_stream("b", "b")
    panel.add_stream("c", "c")
    assert set(panel.snapshot_data()["streams"]) == {"b", "c"}


def test_send_emits_prompt_and_chat_flag(panel, qtbot):
    panel._prompt.setPlainText("  Why is the sky blue?  ")
    panel._chat.setChecked(False)
    with qtbot.waitSignal(panel.sigSubmit, timeout=1000) as blocker:
        qtbot.mouseClick(panel._send, Qt.MouseButton.LeftButton)
    assert blocker.args == ["Why is the sky blue?", False]


def test_prompt_shown_in_prompt_colour(panel):
    panel.add_stream("p", "with prompt", prompt="Tell me a story.")
    panel.append_output(token_output("p", [5], ["Once"]))
    panel.flush()
    view = panel.view("p")
    assert view.toPlainText() == "Tell me a story.\nOnce"
    assert "prompt" in view.tooltip_at(_centre(view, 0))
    assert panel.snapshot_data()["streams"]["p"]["text"] == "Once"
