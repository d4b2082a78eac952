"""Stored results belong to the run that made them (issue 49, point 4): `prepare --profile NAME` stores apart
from the shared store and from other profiles, the data dir follows $INFERLAB_DATA_DIR and $XDG_DATA_HOME,
and the app names a shown result that is not what the last prepare wrote, or a store another prepare
rewrote since the app last showed it."""
from __future__ import annotations

import argparse

import pytest
from PySide6.QtCore import QSettings

from app.talk.compare import prepare
from app.talk.compare.machine import machine_info
from app.talk.compare.profile import MANIFEST, active_profile, use_profile
from app.talk.compare.store import save_result, store_root
from app.talk.compare_run import stored_result
from app.talk.presets import load_preset


@pytest.fixture(autouse=True)
def no_profile():
    use_profile(None)
    yield
    use_profile(None)


def test_the_data_dir_honours_inferlab_data_dir_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path / "mine"))
    assert store_root() == tmp_path / "mine" / "comparisons"
    monkeypatch.delenv("INFERLAB_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert store_root() == tmp_path / "xdg" / "inferlab" / "comparisons"
    use_profile("talk")
    assert store_root() == tmp_path / "xdg" / "inferlab" / "profiles" / "talk" / "comparisons"


@pytest.mark.parametrize("bad", ["../up", "a/b", "", ".hidden", "x" * 65])
def test_a_profile_name_is_one_folder_name(bad):
    with pytest.raises(ValueError, match="profile"):
        use_profile(bad)


def _fake_prepare(monkeypatch, tokens_per_s: float):
    """prepare's loop with the chapter's run replaced by a result of the given figure (the real store,
    the real record of the run)."""
    machine = {**machine_info(), "threads": 1}

    def run_checked(preset, run, conditions, say):
        return {"title": preset.compare.title, "machine": machine, "measured_at": "2026-05-01T10:00:00+00:00",
                "fingerprint": preset.compare.fingerprint(), "metrics": ["tokens_per_s"],
                "comparison": [{"label": "a", "config": {}, "metrics": {"tokens_per_s": tokens_per_s}}], "checks": []}

    monkeypatch.setattr(prepare, "run_checked", run_checked)
    monkeypatch.setattr("engine.loading.loader.load_model", lambda *a, **k: None)


def _prepare(profile: str | None) -> int:
    args = argparse.Namespace(preset=["continuous-batching"], model="m", dtype="auto", device="cpu", threads=1,
                              json=None, background_compile=False, profile=profile)
    return prepare.run_prepare(args)


def _shown(profile: str | None) -> dict | None:
    use_profile(profile)
    return stored_result(load_preset("continuous-batching"), "m", 1)


def test_profiles_keep_their_own_results_and_say_what_changed_since_prepare(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path))
    _fake_prepare(monkeypatch, 11.0)
    assert _prepare("talk") == 0 and active_profile() == "talk"
    _fake_prepare(monkeypatch, 99.0)
    assert _prepare(None) == 0  # another prepare on this machine, without the speaker's profile
    talk, shared = _shown("talk"), _shown(None)
    assert talk["comparison"][0]["metrics"]["tokens_per_s"] == 11.0  # the speaker's figures are still theirs
    assert shared["comparison"][0]["metrics"]["tokens_per_s"] == 99.0
    assert "store_note" not in talk and "store_note" not in shared and talk["prepared"]["by"]
    record = tmp_path / "profiles" / "talk" / "comparisons"
    assert len(list(record.rglob(MANIFEST))) == 1
    # the result measured again (M in the app writes the same store): the panel says so
    use_profile("talk")
    save_result("continuous-batching", "m", {**talk, "comparison": [{"label": "a", "config": {},
                                                                     "metrics": {"tokens_per_s": 5.0}}]})
    again = _shown("talk")
    assert again["store_note"].startswith("⚠ measured again since the last `inferlab prepare` (")
    from widgets.comparison_format import check_flag

    assert check_flag(again)[0].startswith("⚠ measured again since")


def test_the_app_says_when_another_prepare_rewrote_the_store_since_it_last_showed_it(monkeypatch, tmp_path):
    from app.gui.prepare_seen import PrepareSeen

    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path))
    settings = QSettings(str(tmp_path / "app.ini"), QSettings.Format.IniFormat)
    _fake_prepare(monkeypatch, 11.0)
    assert _prepare(None) == 0
    assert PrepareSeen(settings).note(_shown(None)) is None  # the first showing: nothing to compare with
    assert PrepareSeen(settings).note(_shown(None)) is None  # the same prepare at the next start
    _fake_prepare(monkeypatch, 99.0)
    assert _prepare(None) == 0  # someone else's prepare, same store
    session = PrepareSeen(settings)
    note = session.note(_shown(None))
    assert note is not None and note.startswith("⚠ prepared again (") and "since this app last showed" in note
    assert session.note(_shown(None)) == note  # for the whole session
    assert PrepareSeen(settings).note(_shown(None)) is None  # the next start knows this one
    assert PrepareSeen(None).note(_shown(None)) is None  # headless: nothing remembered, nothing said


def test_a_damaged_record_is_no_record(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERLAB_DATA_DIR", str(tmp_path))
    _fake_prepare(monkeypatch, 11.0)
    assert _prepare(None) == 0
    (manifest,) = tmp_path.rglob(MANIFEST)
    for text in ("{ broken", '{"presets": {"continuous-batching": 3}}', "[]", '{"prepare_id": 1}'):
        manifest.write_text(text)
        shown = _shown(None)
        assert shown["comparison"][0]["metrics"]["tokens_per_s"] == 11.0
        assert "store_note" not in shown and "prepared" not in shown


def test_bad_profile_flags_are_one_line(capsys):
    assert _prepare("../x") == 2
    assert "--profile" in capsys.readouterr().err
    from app.cli import main

    assert main(["--profile", "a/b", "--screenshot", "x.png"]) == 2
    assert "--profile" in capsys.readouterr().err
