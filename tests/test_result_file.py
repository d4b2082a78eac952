"""Result files (app/result_file.py): a --json whose folder does not exist is said before the work, and a
result that cannot be written after it goes to stdout instead of a traceback that loses it."""
from __future__ import annotations

import json

from app.cli import main
from app.result_file import unwritable, write_or_print


def test_folders_are_checked_before_the_work(tmp_path):
    assert unwritable({"json": str(tmp_path / "r.json"), "csv": None}) is None
    said = unwritable({"json": str(tmp_path / "missing" / "r.json"), "png": str(tmp_path / "ok.png")})
    assert said == f"--json {tmp_path / 'missing' / 'r.json'}: no such folder"


def test_a_result_that_cannot_be_written_goes_to_stdout(tmp_path, capsys):
    assert write_or_print(str(tmp_path / "r.json"), '{"a": 1}', "who") and json.loads((tmp_path / "r.json").read_text())
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert not write_or_print(str(blocked / "r.json"), '{"a": 2}', "inferlab bench decode")
    out, err = capsys.readouterr()
    assert json.loads(out) == {"a": 2} and "could not write" in err and "the result follows on stdout" in err


def test_bench_and_prepare_refuse_a_missing_folder_at_once(tmp_path, capsys):
    missing = str(tmp_path / "no" / "r.json")
    assert main(["bench", "decode", "--model", "unused-before-the-check", "--json", missing]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["prepare", "--json", missing]) == 2
    assert "no such folder" in capsys.readouterr().err
