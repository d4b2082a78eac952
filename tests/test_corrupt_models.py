"""Corrupt model files (issue 12, point 5): a truncated safetensors file, a truncated GGUF, weights whose
shapes do not match config.json, a broken config.json each end in one ModelLoadError line naming the file
and what is wrong, and `inferlab generate` / `inferlab serve` print that line (exit 2), no traceback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from app.cli import main
from engine import EngineConfig, LLMEngine
from engine.loading.errors import ModelLoadError
from engine.loading.loader import load_model
from tests.test_loader import write_llama_gguf

CUTS = [0, 4, 9, 100, 0.25, 0.5, 0.99, -1]  # bytes kept (a fraction of the file when < 1, -1 = one less)


def kept(size: int, cut: float) -> int:
    return size - 1 if cut == -1 else int(size * cut) if 0 < cut < 1 else int(cut)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))


def copy_model(tiny_llama: Path, tmp_path: Path, name: str = "model") -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_llama, folder)
    return folder


def engine_of(folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_kv_blocks=16, block_size=4))


def one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("inferlab: error:") == 1 and "Traceback" not in err
    return err.split("inferlab: error:")[1].splitlines()[0]


@pytest.mark.parametrize("cut", CUTS)
def test_truncated_safetensors_names_the_file(tiny_llama, tmp_path, cut):
    folder = copy_model(tiny_llama, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: kept(len(data), cut)])
    with pytest.raises(ModelLoadError, match="not a readable safetensors file") as err:
        load_model(str(folder))
    assert str(weights) in str(err.value) and "truncated or corrupt" in str(err.value)


def test_a_cache_that_cannot_be_written_is_one_line(tiny_llama, tmp_path, monkeypatch, capsys):
    """INFERLAB_CACHE_DIR naming a file (or a read-only place): converting a GGUF there raised a traceback."""
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(not_a_folder))
    with pytest.raises(ModelLoadError, match="must be a writable folder"):
        load_model(str(gguf_path))
    line = one_line_error(["generate", "--model", str(gguf_path), "--prompt", "hi", "--max-tokens", "2"], capsys)
    assert str(not_a_folder) in line and "INFERLAB_CACHE_DIR" in line


@pytest.mark.parametrize("name, content, says", [
    ("tokenizer.json", "not json", "not a readable tokenizer"),
    ("tokenizer.json", "[1, 2]", "not a readable tokenizer"),
    ("tokenizer_config.json", "{{{", "not a readable JSON file"),
    ("tokenizer_config.json", "[]", "expected a JSON object"),
    ("tokenizer_config.json", '{"chat_template": 42}', "the chat template is not text"),
    ("chat_template.jinja", "{% for x in %}", "the chat template does not compile"),
    ("generation_config.json", "nope", "not a readable JSON file"),
    ("generation_config.json", '{"eos_token_id": "two"}', "is not token ids")])
def test_tokenizer_and_generation_files_that_lie_name_the_file(tiny_llama, tmp_path, name, content, says):
    """Junk in a model folder's other files: a bare Exception from the tokenizers library ("expected ident
    at line 1 column 2", no file named), JSONDecodeError, AttributeError or a jinja error from inside the
    loader; now one ModelLoadError naming the file."""
    folder = copy_model(tiny_llama, tmp_path)
    (folder / name).write_text(content)
    with pytest.raises(ModelLoadError, match=says) as err:
        load_model(str(folder))
    assert str(folder) in str(err.value)


def test_a_chat_template_that_fails_when_rendered_is_a_value_error(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    (folder / "chat_template.jinja").write_text("{{ foo.bar() }}")
    tokenizer = load_model(str(folder)).tokenizer
    with pytest.raises(ValueError, match="the chat template failed"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_a_damaged_converted_copy_is_converted_again(tiny_llama, tmp_path):
    """The converted copy of a GGUF cut short in the cache (a full disk) is converted again at the next
    load; downloading the GGUF again, as the error used to say, would have hit the same copy."""
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    first = load_model(str(gguf_path))
    weights = Path(first.path) / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    again = load_model(str(gguf_path))
    assert again.path == first.path and weights.read_bytes() == whole
    (Path(first.path) / "tokenizer.json").unlink()  # a file gone from the copy
    assert load_model(str(gguf_path)).path == first.path and (Path(first.path) / "tokenizer.json").is_file()


def test_a_damaged_older_conversion_says_to_remove_the_copy(tiny_llama, tmp_path):
    """Copies converted before the sizes were written are taken as they are; one that will not read says
    which folder to remove (the GGUF itself is fine)."""
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    folder = Path(load_model(str(gguf_path)).path)
    marker = folder / "inferlab_conversion.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "file_bytes"}))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="converted copy") as err:
        load_model(str(gguf_path))
    assert f"remove the folder {folder}" in str(err.value) and "Download it again" not in str(err.value)


@pytest.mark.parametrize("cut", CUTS)
def test_truncated_gguf_names_the_file(tiny_llama, tmp_path, cut):
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    data = gguf_path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: kept(len(data), cut)])
    with pytest.raises(ModelLoadError, match="not a readable GGUF file") as err:
        load_model(str(bad))
    assert str(bad) in str(err.value)
    assert not list((tmp_path / "cache" / "converted").glob("*/config.json"))  # no half conversion kept


@pytest.mark.parametrize("change", [{"intermediate_size": 96}, {"hidden_size": 32}, {"num_key_value_heads": 4},
                                    {"vocab_size": 500}, {"num_attention_heads": 2}])
def test_shapes_that_do_not_match_the_config(tiny_llama, tmp_path, change):
    folder = copy_model(tiny_llama, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelLoadError, match="has shape .* but config.json implies") as err:
        load_model(str(folder))
    assert str(folder / "model.safetensors") in str(err.value)


def test_missing_and_extra_tensors_fail_the_engine_with_the_folder(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    dropped = {k: v for k, v in tensors.items() if "layers.1.mlp.down_proj" not in k}
    save_file(dropped, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lacks") as err:
        engine_of(folder)
    assert str(folder) in str(err.value) and "cannot build the model" in str(err.value)
    extra = tensors["model.layers.1.mlp.down_proj.weight"].clone()
    save_file({**tensors, "model.layers.7.mlp.down_proj.weight": extra}, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="has no place"):
        engine_of(folder)


def test_an_unsupported_rope_scaling_is_a_load_error(tiny_llama, tmp_path):
    folder = copy_model(tiny_llama, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "longrope", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported rope scaling 'longrope'") as err:
        engine_of(folder)
    assert str(folder) in str(err.value)


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"{not json", b"[]", b'{"model_type": "llama"}'])
def test_broken_config_json_names_the_file(tiny_llama, tmp_path, content):
    folder = copy_model(tiny_llama, tmp_path)
    (folder / "config.json").write_bytes(content)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder))
    assert str(folder / "config.json") in str(err.value)


def test_generate_and_serve_print_one_line(tiny_llama, tmp_path, capsys):
    folder = copy_model(tiny_llama, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    line = one_line_error(["generate", "--model", str(folder), "--prompt", "hi"], capsys)
    assert str(weights) in line and "truncated" in line
    line = one_line_error(["serve", "--model", str(folder), "--port", "0"], capsys)
    assert str(weights) in line
    bad_gguf = tmp_path / "half.gguf"
    data = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf").read_bytes()
    bad_gguf.write_bytes(data[: len(data) // 2])
    line = one_line_error(["generate", "--model", str(bad_gguf), "--prompt", "hi"], capsys)
    assert str(bad_gguf) in line and "GGUF" in line

