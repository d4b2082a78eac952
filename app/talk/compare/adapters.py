"""The LoRA adapters a comparison mixes (the `adapters` knob): the ones found for the model (trained with
`inferlab train-lora` or shipped in assets/lora/) first, then random ones of the same rank and targets
written to a scratch folder, because a mix of 16 needs 16 adapters and its cost (not its answers) is
what the comparison measures. The result entry says how many were random."""
from __future__ import annotations

from pathlib import Path

from engine.files import read_json
from engine.lora.peft_write import random_adapter, save_peft_adapter
from engine.lora.shipped import available_adapters

DEFAULT_TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


def ensure_adapters(engine, n: int, scratch: Path) -> tuple[tuple[str, ...], int]:
    """(names of n adapters registered on `engine`, how many of them are random)."""
    have = [i.name for i in engine.list_loras()]
    found = available_adapters(str(engine.model_path))
    rank = min(8, engine.config.max_lora_rank)
    targets = DEFAULT_TARGETS
    for name, path in found.items():
        if len(have) >= n:
            break
        if name not in have:
            try:
                cfg = read_json(path / "adapter_config.json")
            except (OSError, ValueError):
                continue  # (engine.add_lora would refuse it with the reason; a random adapter stands in)
            if not isinstance(cfg, dict):
                continue
            if cfg.get("r", rank) > engine.config.max_lora_rank:
                continue
            engine.add_lora(name, str(path))
            have.append(name)
            rank, targets = cfg.get("r", rank), tuple(cfg.get("target_modules") or targets)
    i = 0
    while len(have) < n:
        name = f"random-{i}"
        i += 1
        if name in have:
            continue
        folder = scratch / name
        if not (folder / "adapter_config.json").exists():
            save_peft_adapter(folder, random_adapter(engine.model_config, rank, targets, seed=i), rank, 2.0 * rank)
        engine.add_lora(name, str(folder))
        have.append(name)
    names = tuple(have[:n])
    return names, sum(1 for x in names if x.startswith("random-"))
