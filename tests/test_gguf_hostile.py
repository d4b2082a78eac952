"""Lying files on the way to a managed llama-server's GGUF variants (app/managed/gguf.py): a
llama-quantize that exits 0 but writes nothing (or garbage), a cached variant that is garbage."""
from __future__ import annotations

import sys

import llama_cpp_peer
import pytest

from app.managed import gguf


def fake_quantize(tmp_path, writes: bytes | None) -> None:
    """<tmp_path>/bin/llama-quantize: exits 0, writing `writes` to its output (nothing when None)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    exe = tmp_path / "bin" / "llama-quantize"
    body = "" if writes is None else f"open(sys.argv[2], 'wb').write({writes!r})\n"
    exe.write_text(f"#!{sys.executable}\nimport sys\n{body}sys.exit(0)\n")
    exe.chmod(0o755)


def bf16_file(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_LLAMA_CPP_DIR", str(tmp_path))
    bf16 = tmp_path / "m-abc.bf16.gguf"
    bf16.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setattr(gguf, "bf16_gguf", lambda model_path, directory=None: bf16)
    return bf16


def test_a_quantize_that_exits_0_but_writes_nothing_skips_the_variant_with_a_line(tmp_path, monkeypatch):
    bf16 = bf16_file(tmp_path, monkeypatch)
    for writes in (None, b"not a gguf at all"):
        fake_quantize(tmp_path, writes)
        said = []
        assert gguf.gguf_variants("folder", ("bf16", "q8_0"), say=said.append) == {"bf16": bf16}
        assert said == ["skipping q8_0: llama-quantize Q8_0 exited 0 but wrote no GGUF (m-abc.q8_0.partial)"]
        assert not (tmp_path / "m-abc.q8_0.gguf").exists() and not (tmp_path / "m-abc.q8_0.partial").exists()


def test_a_garbage_cached_variant_is_made_again(tmp_path, monkeypatch):
    bf16 = bf16_file(tmp_path, monkeypatch)
    cached = tmp_path / "m-abc.q8_0.gguf"
    cached.write_bytes(b"<html>502 Bad Gateway</html>")  # a download or copy that went wrong
    fake_quantize(tmp_path, b"GGUF" + bytes(60))
    assert gguf.quantized_gguf(bf16, "q8_0") == cached
    assert cached.read_bytes().startswith(b"GGUF")


def test_a_gguf_dir_file_that_is_not_a_gguf_is_said_before_any_server_starts(tmp_path):
    from app.managed.setup import SetupError, gguf_dir_files

    (tmp_path / "m-bf16.gguf").write_bytes(b"GGUF" + bytes(60))
    (tmp_path / "m-q8_0.gguf").write_bytes(b"")  # a copy cut short at nothing
    with pytest.raises(SetupError, match=r"not a GGUF file \(no GGUF magic\): m-q8_0.gguf"):
        gguf_dir_files(str(tmp_path))
    (tmp_path / "m-q8_0.gguf").write_bytes(b"GGUF" + bytes(60))
    assert set(gguf_dir_files(str(tmp_path))) == {"bf16", "q8_0"}


@pytest.mark.llama_cpp
@pytest.mark.parametrize("content", [b"not a gguf", b"GGUF\x03\x00\x00\x00" + bytes(8)], ids=["garbage", "truncated"])
def test_a_real_llama_server_on_a_lying_gguf_is_a_failed_point_with_its_error(tmp_path, content):
    from app.managed.llama_server import LlamaServer
    from app.managed.server import ManagedServer, PointFailed
    from app.managed.table import ServedModel, ServerPoint

    binary = llama_cpp_peer.tool("llama-server")
    lying = tmp_path / "m.bf16.gguf"
    lying.write_bytes(content)
    server = ManagedServer(LlamaServer(ctx_per_slot=256), str(binary), ServedModel({"bf16": str(lying)}, name="m"),
                           ServerPoint(batch=1), threads=1, start_timeout_s=60.0)
    with pytest.raises(PointFailed, match="exited") as failed:
        server.start()
    assert failed.value.log_tail and not server.alive()
