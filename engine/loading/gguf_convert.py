"""GGUF -> Hugging Face folder: dequantize with the `gguf` package, undo llama.cpp's q/k permutation,
rebuild config.json and the tokenizer, write safetensors. Done once per file, cached by content hash."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.loading.errors import ModelLoadError, Progress, read_json
from engine.loading.gguf_check import check_gguf
from engine.loading.origin import MARKER, tensor_type_elements

# -- GGUF conversion ------------------------------------------------------------------------------
# A GGUF is converted once into an HF folder in the cache, named by the file's content hash, so a
# moved or renamed file still hits the cache and a changed file never does.

CONVERTER_VERSION = 1  # bump when the output changes; older conversions are redone
_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_GGUF_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def convert_gguf(gguf_path: Path, out_root: Path, report: Progress) -> Path:
    """The HF folder for this GGUF, converting it first unless the cache already has it."""
    check_gguf(gguf_path)  # a regular file whose header fits its size, before hashing or reading it
    digest = _sha256_16(gguf_path, report)
    final = out_root / digest
    if _is_current_conversion(final):
        return final
    if (final / MARKER).is_file():
        report("the converted copy in the cache is damaged or out of date: converting again", 0.03)
    out_root.mkdir(parents=True, exist_ok=True)
    # Build in a temp folder beside the final one and rename: readers never see half a conversion.
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=out_root))
    try:
        _read_gguf(gguf_path, tmp, digest, report)
        for path in (tmp, *tmp.iterdir()):  # mkdtemp and safetensors create owner-only files
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if not _is_current_conversion(final):  # else another process finished first: keep theirs
            shutil.rmtree(final, ignore_errors=True)  # a conversion by an older converter
            os.rename(tmp, final)
    except OSError:
        if not _is_current_conversion(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report("conversion done", 1.0)
    return final


def _read_gguf(gguf_path: Path, out: Path, digest: str, report: Progress) -> None:
    """_write_converted, with what a truncated or corrupt file raises from deep inside the reader
    (ValueError, IndexError from numpy views of missing bytes) turned into one line naming the file."""
    try:
        _write_converted(gguf_path, out, digest, report)
    except (ModelLoadError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 (the gguf reader has no error type of its own)
        raise ModelLoadError(f"{gguf_path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                             "truncated or corrupt? Download it again") from e


def _is_current_conversion(folder: Path) -> bool:
    """Made by this converter, and whole: every file it wrote still has the size it had (a copy cut short
    by a full disk, or a file removed, is converted again instead of failing every load; conversions that
    predate the sizes are taken as they are)."""
    marker = read_json(folder / MARKER, lenient=True)
    if marker.get("converter_version") != CONVERTER_VERSION:
        return False
    sizes = marker.get("file_bytes")
    if not isinstance(sizes, dict):
        return True
    try:
        return all((folder / str(name)).stat().st_size == size for name, size in sizes.items())
    except OSError:
        return False


def _sha256_16(path: Path, report: Progress) -> str:

    report(f"hashing {path.name}", 0.02)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()[:16]


def _write_converted(gguf_path: Path, out: Path, digest: str, report: Progress) -> None:
    import gguf

    report(f"reading {gguf_path.name}", 0.03)
    reader = gguf.GGUFReader(str(gguf_path))
    arch = _gguf_field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ModelLoadError(f"{gguf_path.name}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(_GGUF_ARCHS)})")
    # Keep full precision only when the file has it; dequantized weights otherwise fit bf16.
    all_f32 = all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    dtype = torch.float32 if all_f32 else torch.bfloat16
    hf_config = _gguf_hf_config(reader, arch, str(dtype).removeprefix("torch."))
    _write_gguf_tokenizer(gguf_path, reader, out, report)
    state_dict = _gguf_state_dict(reader, arch, hf_config, dtype, report)
    report("writing model.safetensors", 0.9)
    from safetensors.torch import save_file

    save_file(state_dict, str(out / "model.safetensors"), metadata={"format": "pt"})
    eos = [i for i in (_gguf_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
           if i is not None]
    generation = {"bos_token_id": hf_config["bos_token_id"], "eos_token_id": sorted(set(eos), key=eos.index)}
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    marker = {"converter_version": CONVERTER_VERSION, "source": str(gguf_path), "sha256_16": digest,
              "tensor_types": tensor_type_elements(reader),
              "file_bytes": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}}
    (out / MARKER).write_text(json.dumps(marker, indent=2))


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _gguf_hf_config(reader: Any, arch: str, dtype_name: str) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return _gguf_field(reader, f"{arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    heads = get("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    kv_heads = max(kv_heads) if isinstance(kv_heads, list) else kv_heads
    hidden = get("embedding_length")
    cfg: dict[str, Any] = {
        "architectures": [_GGUF_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": get("vocab_size") or len(reader.get_field("tokenizer.ggml.tokens").data),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": get("attention.key_length") or hidden // heads,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,  # llama.cpp drops a tied lm_head
        "hidden_act": "silu",
        "bos_token_id": _gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        "dtype": dtype_name,
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v bias; the others say so explicitly
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    scaling = get("rope.scaling.type")
    if scaling in ("linear", "yarn"):
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": get("rope.scaling.factor"),
                               "original_max_position_embeddings": get("rope.scaling.original_context_length")}
    return cfg


def _gguf_state_dict(reader: Any, arch: str, cfg: dict[str, Any], dtype: torch.dtype,
                     report: Progress) -> dict[str, torch.Tensor]:
    import numpy as np
    from gguf.quants import dequantize

    state_dict: dict[str, torch.Tensor] = {}
    for i, tensor in enumerate(reader.tensors):
        name = _hf_tensor_name(tensor.name)
        if name is None:
            continue
        report(f"dequantizing {tensor.name} ({tensor.tensor_type.name})", 0.1 + 0.8 * i / len(reader.tensors))
        # GGUF lists dims fastest-first; reversed they are PyTorch's (out_features, in_features).
        weights = dequantize(tensor.data, tensor.tensor_type).reshape([int(d) for d in reversed(tensor.shape)])
        if arch == "llama" and ".q_proj." in name:
            weights = _unpermute_rope(weights, cfg["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in name:
            weights = _unpermute_rope(weights, cfg["num_key_value_heads"])
        state_dict[name] = torch.from_numpy(np.array(weights, dtype=np.float32)).to(dtype)
    return state_dict


def _unpermute_rope(weights: Any, num_heads: int) -> Any:
    """Undo llama.cpp's q/k row permutation.

    HF Llama rotates each head's two halves (rotate_half); llama.cpp rotates adjacent pairs, so its
    converter reorders each head's rows from [x0..x(d/2-1), y0..] to [x0, y0, x1, y1, ...]:
    reshape(heads, 2, d/2, ...).swapaxes(1, 2). This is the inverse.
    """
    rows = weights.shape[0]
    per_head = weights.reshape(num_heads, rows // num_heads // 2, 2, *weights.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weights.shape)


def _hf_tensor_name(gguf_name: str) -> str | None:
    base, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
    layer = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    hf = f"model.layers.{layer[1]}.{_GGUF_LAYER.get(layer[2], '')}" if layer and layer[2] in _GGUF_LAYER else None
    hf = hf or _GGUF_GLOBAL.get(base)
    if hf is not None:
        return f"{hf}.{kind}"
    if base == "rope_freqs":
        # Llama 3.1-style RoPE scaling factors: not carried over (the HF config cannot express them
        # from this tensor alone); short contexts are only mildly affected.
        import warnings

        warnings.warn("GGUF rope_freqs (Llama 3 RoPE scaling) is ignored by the converter", stacklevel=2)
        return None
    raise ModelLoadError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent here (unsupported variant)")


# llama.cpp pre-tokenizer names that transformers' GGUF tokenizer builder does not know; without
# these it falls back to GPT-2's split, which differs (e.g. SmolLM splits every digit).
def _extra_pre_tokenizer(pre: str | None) -> Any:
    from tokenizers import pre_tokenizers

    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return None


def _write_gguf_tokenizer(gguf_path: Path, reader: Any, out: Path, report: Progress) -> None:
    report("building the tokenizer", 0.05)
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ModelLoadError("converting a GGUF tokenizer needs the transformers package") from e
    # A folder of its own, so transformers cannot pick up unrelated files sitting beside the GGUF.
    src = out / "_gguf_src"
    src.mkdir()
    (src / gguf_path.name).symlink_to(gguf_path.resolve())
    try:
        AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_path.name).save_pretrained(str(out))
    except Exception as e:
        raise ModelLoadError(f"could not build a tokenizer from {gguf_path.name}: {e}") from e
    finally:
        shutil.rmtree(src)
    _patch_gguf_tokenizer(out / "tokenizer.json", reader)
    # State llama.cpp's BOS/EOS flags explicitly, so every reader of the folder agrees on them.
    config = read_json(out / "tokenizer_config.json")
    for key in ("add_bos_token", "add_eos_token"):
        value = _gguf_field(reader, f"tokenizer.ggml.{key}")
        if value is not None:
            config[key] = bool(value)
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _patch_gguf_tokenizer(tokenizer_file: Path, reader: Any) -> None:
    """Fix what transformers' GGUF tokenizer builder misses: llama.cpp pre-tokenizers it does not
    know, and the file's add_bos_token flag (llama.cpp adds BOS when it says so, whatever the vocab)."""
    from tokenizers import Tokenizer as FastTokenizer
    from tokenizers import processors

    fast = FastTokenizer.from_file(str(tokenizer_file))
    pre_tokenizer = _extra_pre_tokenizer(_gguf_field(reader, "tokenizer.ggml.pre"))
    if pre_tokenizer is not None:
        fast.pre_tokenizer = pre_tokenizer
    add_bos = _gguf_field(reader, "tokenizer.ggml.add_bos_token")
    bos_id = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    if add_bos is not None and bos_id is not None:
        adds_bos = fast.encode("a").ids[:1] == [bos_id]
        if bool(add_bos) != adds_bos:
            bos = fast.id_to_token(bos_id)
            fast.post_processor = processors.TemplateProcessing(
                single=f"{bos}:0 $A:0" if add_bos else "$A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1" if add_bos else "$A:0 $B:1",
                special_tokens=[(bos, bos_id)] if add_bos else [],
            )
    fast.save(str(tokenizer_file))
