"""Every file the app reads goes through one bounded reader (issue 48, point 4, and the Low items on
--model and GGUF files): a preset path that was /dev/zero grew to 2 GB in 6 s, a FIFO hung, a TOML nested
50,000 deep was a RecursionError traceback, a 1,000,000-element array a 4 MB error line. Presets,
settings, stored results, adapters' configs and a model's files now refuse what is not a small regular
file, or nests too deep, with one short line naming the file; a GGUF whose counts do not fit its size
says which key or tensor."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

from engine import files

FAST_S = 10.0  # each read must answer well within this (a FIFO read blocked for ever before)


def within(fn, seconds: float = FAST_S, fifo=None):
    """fn()'s result or exception (returned, not raised) within `seconds`; a FIFO a reader still waits on
    is opened for writing and closed afterwards, so no thread is left blocked whatever happened."""
    out = []
    thread = threading.Thread(target=lambda: out.append(_call(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    if fifo is not None and thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert out, f"still reading after {seconds:g} s"
    return out[0]


def _call(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 (handed back to the test to look at)
        return exc


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_the_reader_refuses_what_is_not_a_small_regular_file_in_one_line(tmp_path, fifo):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (files.MAX_TEXT_BYTES + 1))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"a = 1\nb = '\xe9'\n")
    cases = {fifo: "is a FIFO (named pipe), not a regular file", tmp_path: "is a folder, not a regular file",
             "/dev/zero": "is a character device, not a regular file", big: "is larger than the 4,194,304 bytes",
             latin: "not UTF-8 text (byte 0xe9 at offset 11)"}
    for path, says in cases.items():
        err = within(lambda p=path: files.read_text(p), fifo=fifo)
        assert isinstance(err, files.UnreadableFile) and str(err) == f"{path}: {says}" or says in str(err), err
        assert len(str(err)) < 200
    assert files.read_bytes(big, 10, cut=True) == b" " * 10
    assert isinstance(within(lambda: files.read_text(tmp_path / "absent")), FileNotFoundError)


@pytest.mark.parametrize("kind", ["json", "toml"])
def test_documents_nested_50000_deep_or_past_the_cap_are_one_line(tmp_path, kind):
    deep, ok = tmp_path / f"deep.{kind}", tmp_path / f"ok.{kind}"
    if kind == "json":
        deep.write_text("[" * 50_000 + "]" * 50_000)
        ok.write_text(json.dumps({"a": [[[1]]]}))
        read = files.read_json
    else:
        deep.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
        ok.write_text("a = [[[1]]]\n")
        read = files.read_toml
    err = _call(lambda: read(deep))
    assert isinstance(err, files.UnreadableFile) and str(err) == f"{deep}: nested deeper than 64 levels", err
    assert isinstance(_call(lambda: read(ok, max_depth=3)), files.UnreadableFile)
    assert read(ok, max_depth=4) in ({"a": [[[1]]]},)


def test_a_preset_that_is_a_fifo_a_folder_deep_or_huge_is_one_short_line(tmp_path, fifo):
    from app.talk.presets import PresetError, load_preset

    deep = tmp_path / "deep.toml"
    deep.write_text('[preset]\ntitle = "t"\ncaption = "c"\nx = ' + "[" * 50_000 + "]" * 50_000 + "\n")
    wide = tmp_path / "wide.toml"
    wide.write_text('[preset]\ntitle = "t"\ncaption = "c"\npanels = [' + ",".join(["1"] * 200_000) + "]\n")
    cases = {fifo: "is a FIFO", tmp_path: "is a folder", deep: "nested deeper than 64 levels",
             wide: "[preset] panels: expected a list of panel names"}
    for path, says in cases.items():
        err = within(lambda p=path: load_preset(str(p)), fifo=fifo)
        assert isinstance(err, PresetError) and says in str(err), repr(err)[:300]
        assert len(str(err)) <= 400 and "\n" not in str(err)


def test_dev_zero_as_a_preset_or_a_stored_result_is_refused_without_reading_it(tmp_path):
    """In a child whose address space is capped at 1 GiB: reading /dev/zero whole would fail it."""
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
        from pathlib import Path
        from app.talk.presets import PresetError, load_preset
        from app.tradeoff import sweep_store
        from app.talk.compare import store
        try:
            load_preset("/dev/zero")
        except PresetError as exc:
            assert "is a character device" in str(exc), exc
        base = Path({str(tmp_path)!r})
        sweep_path = sweep_store.store_path("m", "model", base)
        sweep_path.symlink_to("/dev/zero")
        assert sweep_store.load("m", "model", base) is None
        machine = {{"cpu": "x", "threads": 1}}
        stored = store.result_path("p", "model", machine, base)
        stored.parent.mkdir(parents=True)
        stored.symlink_to("/dev/zero")
        assert store.load_stored("p", "model", machine, root=base) is None
        print("refused")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr[-2000:]


def test_a_settings_file_that_is_a_fifo_starts_with_defaults_and_a_line(tmp_path, monkeypatch, capsys, qapp):
    from app.gui.settings_file import settings_path, user_settings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = settings_path("inferlab-test", "inferlab-test")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    settings, persist = within(lambda: user_settings("inferlab-test", "inferlab-test"), fifo=path)
    assert persist is False and settings.fileName() != str(path)
    assert f"the settings file {path}: is a FIFO" in capsys.readouterr().err
    path.unlink()
    path.write_text("[General]\ntheme=dark\n")
    settings, persist = user_settings("inferlab-test", "inferlab-test")
    assert persist is True


def test_an_adapter_config_that_is_a_fifo_or_deep_is_a_load_error(tmp_path):
    from engine.lora.adapter import read_config
    from engine.lora.checks import LoraLoadError

    os.mkfifo(tmp_path / "adapter_config.json")
    err = within(lambda: read_config(tmp_path), fifo=tmp_path / "adapter_config.json")
    assert isinstance(err, LoraLoadError) and "is a FIFO" in str(err), err
    (tmp_path / "adapter_config.json").unlink()
    (tmp_path / "adapter_config.json").write_text('{"r": ' + "[" * 50_000 + "]" * 50_000 + "}")
    err = _call(lambda: read_config(tmp_path))
    assert isinstance(err, LoraLoadError) and "nested deeper than 64 levels" in str(err), err


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors", "chat_template.jinja",
                                  "generation_config.json"])
def test_a_model_file_that_is_a_fifo_names_it(tiny_llama, tmp_path, monkeypatch, name):
    from engine.loading.errors import ModelLoadError
    from engine.loading.loader import load_model

    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    err = within(lambda: load_model(str(folder)), fifo=folder / name)
    assert isinstance(err, ModelLoadError) and str(folder / name) in str(err) and "FIFO" in str(err), err


@pytest.mark.parametrize("target,says", [("fifo", "is a FIFO (named pipe)"), ("/dev/zero", "is a character device")])
def test_a_fifo_or_a_device_as_the_model_says_what_it_is(tmp_path, target, says):
    from engine.loading.errors import ModelLoadError
    from engine.loading.loader import load_model

    path = tmp_path / "fifo"
    if target == "fifo":
        os.mkfifo(path)
    else:
        path = target
    err = within(lambda: load_model(str(path)), fifo=path if target == "fifo" else None)
    assert isinstance(err, ModelLoadError) and str(err).startswith(f"{path} {says}"), err


def _gguf(n_tensors: int, n_kv: int, body: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def _text(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


ARCH = _text(b"general.architecture") + struct.pack("<I", 8) + _text(b"llama")


@pytest.mark.parametrize("data,says", [
    (_gguf(0, 2**62, b""), "it says 4,611,686,018,427,387,904 keys, more than its 0 bytes can hold"),
    (_gguf(0, 1, _text(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 0, 2**40) + bytes(64)),
     "'tokenizer.ggml.tokens' says 1,099,511,627,776 items, more than the 64 bytes left can hold"),
    (_gguf(0, 1, _text(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 10**7) + bytes(8 * 10**6)),
     "'tokenizer.ggml.tokens' says 10,000,000 items"),
    (_gguf(0, 1, _text(b"general.architecture") + struct.pack("<IQ", 8, 2**60) + b"llama"),
     "the text of 'general.architecture' needs 1,152,921,504,606,846,976 bytes"),
    (_gguf(1, 1, ARCH + _text(b"token_embd.weight") + struct.pack("<IQQIQ", 2, 2**40, 2**40, 0, 0)),
     "tensor 'token_embd.weight' (4,835,703,278,458,516,698,824,704 bytes at 0) lies past the end"),
    (_gguf(1, 1, ARCH + _text(b"token_embd.weight") + struct.pack("<I", 9) + bytes(80)),
     "tensor 'token_embd.weight' has 9 dimensions"),
    (_gguf(0, 1, _text(b"x") + struct.pack("<I", 77) + bytes(8)), "'x' has value type 77"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1"),
], ids=["keys", "array", "strings", "text", "tensor-bytes", "dims", "type", "version"])
def test_a_gguf_bomb_names_the_file_and_what_is_wrong(tmp_path, data, says):
    from engine.loading.errors import ModelLoadError
    from engine.loading.loader import load_model

    path = tmp_path / "bomb.gguf"
    path.write_bytes(data)
    err = within(lambda: load_model(str(path)))
    assert isinstance(err, ModelLoadError) and str(err).startswith(f"{path}: not a readable GGUF file (")
    assert says in str(err), err
