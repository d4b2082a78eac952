"""The talk's order in data (presets/talk.toml, app/talk/talk_order.py): PgDown / PgUp, the Presets menu and
`inferlab prepare` walk it; a talk.toml that lies is one line naming the file, the line and the key."""
from __future__ import annotations

import functools
import os
import threading

import pytest
from app_helpers import close_window, open_window, wait_until

from app.talk import presets
from app.talk.talk_order import Talk, load_talk, load_talk_or_files

PRESET = '[preset]\ntitle = "{name}"\ncaption = "C"\n\n[engine]\nmax_num_seqs = 4\n'


def folder(tmp_path, talk: str | None, names=("a", "b", "c")):
    for name in names:
        (tmp_path / f"{name}.toml").write_text(PRESET.format(name=name))
    if talk is not None:
        (tmp_path / "talk.toml").write_text(talk)
    return tmp_path


def chapters(*names: str) -> str:
    return "".join(f'[[chapter]]\npreset = "{n}"\n\n' for n in names)


def test_the_talk_orders_the_presets_and_talk_toml_is_not_one(tmp_path):
    talk = load_talk(folder(tmp_path, '# the order\n[[chapter]]\npreset = "c"\ntitle = "Why c?"\n\n' + chapters("a")))
    assert talk.names == ("c", "a", "b") and talk.chapters == ("c", "a")  # b is not listed: after the talk
    assert dict(talk.titles) == {"c": "Why c?"}  # titles are optional
    assert presets.available(tmp_path) == ["c", "a", "b"]
    with pytest.raises(presets.PresetError, match="talk's order"):
        presets.load_preset("talk", tmp_path)


def test_a_folder_without_a_talk_goes_by_file_name(tmp_path):
    assert load_talk(folder(tmp_path, None)) == Talk(("a", "b", "c"))


@pytest.mark.parametrize("text, where", [
    (chapters("a") + '[[chapter]]\npreset = "d"\n', r"talk.toml:5: \[\[chapter\]\] #2: preset: no preset 'd' in .*"
                                                     r"\(have: a, b, c\)"),
    (chapters("a", "b", "a"), r"talk.toml:8: \[\[chapter\]\] #3: preset: 'a' is chapter 1 already"),
    ('[[chapter]]\npreset = "a"\nslide = 3\n', r"talk.toml:3: \[\[chapter\]\] #1: unknown key 'slide'"),
    ('[[chapter]]\ntitle = "no preset"\n', r"talk.toml:1: \[\[chapter\]\] #1: preset: expected a preset's name, "
                                           "got None"),
    ('[[chapter]]\npreset = "a"\ntitle = 7\n', r"talk.toml:3: \[\[chapter\]\] #1: title: expected one line"),
    ('[[chapter]]\npreset = "a"\ntitle = "two\\nlines"\n', r"talk.toml:3: .*title: expected one line"),
    ('order = ["a", "b"]\n', r"talk.toml:1: unknown key 'order'; expected \[\[chapter\]\] tables"),
    ('chapter = "a"\n', r"talk.toml:1: expected one or more \[\[chapter\]\] tables"),
    ("[[chapter]\npreset = 'a'\n", r"talk.toml:1: .*TOML"),  # junk
    ("\xff\xfe[[chapter]]", r"talk.toml.*UTF-8"),
])
def test_a_talk_that_lies_is_one_line(tmp_path, text, where):
    path = tmp_path / "talk.toml"
    folder(tmp_path, None)
    path.write_bytes(text.encode("utf-8") if text.isascii() else text.encode("latin-1"))
    with pytest.raises(presets.PresetError, match=where) as caught:
        presets.available(tmp_path)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_fifo_or_a_huge_talk_is_refused_at_once(tmp_path):
    """The bounded reader (engine/files.py): a FIFO does not hang the app; a huge file is not read whole."""
    folder(tmp_path, None)
    os.mkfifo(tmp_path / "talk.toml")
    done = []
    reader = threading.Thread(target=lambda: done.append(_error(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    assert done and "FIFO" in done[0]
    os.unlink(tmp_path / "talk.toml")
    (tmp_path / "talk.toml").write_text(chapters("a") + "# " + "x" * (5 * 2**20))
    assert "more than" in _error(tmp_path) or "bytes" in _error(tmp_path)


def _error(presets_dir) -> str:
    try:
        presets.available(presets_dir)
    except presets.PresetError as exc:
        return str(exc)
    return ""


def test_the_app_walks_a_lying_talk_by_file_name_after_saying_so_in_one_line(tmp_path):
    said: list[str] = []
    talk = load_talk_or_files(folder(tmp_path, chapters("c", "c")), said.append)
    assert talk.names == ("a", "b", "c") and len(said) == 1 and "is chapter 1 already" in said[0]


def test_prepare_reads_the_talk_and_a_lying_one_stops_it_before_any_work(tmp_path, monkeypatch, capsys):
    from app.cli import main

    folder(tmp_path, chapters("a", "nope"))
    monkeypatch.setattr(presets, "available", functools.partial(presets.available, tmp_path))
    assert main(["prepare", "--json", str(tmp_path / "out.json"), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "talk.toml:5: [[chapter]] #2: preset: no preset 'nope'" in err[0]
    assert not (tmp_path / "out.json").exists()


def test_pgdown_and_pgup_follow_the_talk_and_the_menu_names_its_chapters(qapp, tiny_llama, tmp_path):
    window = open_window(tiny_llama, preset="kv-cache")
    ctl = window.controller
    try:
        text = window.actions_by_name["preset:prefill-vs-decode"].text()  # the real talk, in the Presets menu
        assert text == "1. prefill-vs-decode — How does token by token generation work?"
        assert window.actions_by_name["preset:tradeoff"].text().startswith(f"{len(presets.available())}. tradeoff")
        ctl.state.presets_dir = folder(tmp_path, chapters("c", "b", "a"))
        assert ctl.apply_preset("c"), ctl.last_error
        ctl.step_preset(+1)
        assert ctl.preset.name == "b"  # the talk's next chapter (by file name: a)
        ctl.step_preset(+1)
        ctl.step_preset(+1)
        assert ctl.preset.name == "c"  # round to the first chapter
        ctl.step_preset(-1)
        assert ctl.preset.name == "a"
        (tmp_path / "talk.toml").write_text(chapters("a", "zz"))  # edited while the app runs: it lies now
        ctl.step_preset(+1)
        assert "talk.toml:5: [[chapter]] #2: preset: no preset 'zz'" in (ctl.last_error or "")
        assert ctl.preset.name == "b"  # by file name meanwhile; the window keeps going
        wait_until(qapp, lambda: ctl.engine_ready, 30)
    finally:
        close_window(window)
