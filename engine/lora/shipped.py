"""Where an adapter of a given name is found for a model: the ones `inferlab train-lora` saved in the
user cache first, then the ones shipped in assets/lora/ for the built-in model (a folder named by the
converted GGUF's content hash, as the shipped MTP heads are, so the same on every machine)."""
from __future__ import annotations

import hashlib
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "lora"
CONFIG = "adapter_config.json"


def trained_dir(model_path: str) -> Path:
    """The folder `inferlab train-lora` writes a model's adapters into by default (one folder per style)."""
    from engine.loading.loader import cache_root

    key = hashlib.sha256(str(Path(model_path).resolve()).encode()).hexdigest()[:16]
    return cache_root() / "lora" / key


def _folders(model_path: str) -> list[Path]:
    return [trained_dir(model_path), SHIPPED / Path(model_path).name]


def available_adapters(model_path: str) -> dict[str, Path]:
    """name -> PEFT folder of every adapter found for this model (trained ones win over shipped ones)."""
    out: dict[str, Path] = {}
    for folder in reversed(_folders(model_path)):
        if folder.is_dir():
            out.update({d.name: d for d in sorted(folder.iterdir()) if (d / CONFIG).is_file()})
    return out


def find_adapter(model_path: str, name: str) -> Path | None:
    return available_adapters(model_path).get(name)
