"""Train the LoRA adapters shipped in assets/lora/ (what `inferlab train-lora` makes with its defaults, one
per style) or copy already-trained ones there: stored in bfloat16 (half the bytes; the engine casts to
its own dtype), under the converted default model's folder name, as the shipped MTP heads are.

    python scripts/ship_loras.py                      # train shout, pirate and bullets (~2-3 min each, 2 cores)
    python scripts/ship_loras.py --from DIR           # copy DIR/<style> folders trained before
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

STYLES = ("shout", "pirate", "bullets")
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the built-in model is (converted from its Q4_1 GGUF)
REPO = Path(__file__).resolve().parents[1]


def ship(src: Path, dest: Path, base_name: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(src / "adapter_model.safetensors").items()}
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = base_name
    (dest / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", type=Path, help="a folder with one trained adapter folder per style")
    ap.add_argument("--styles", nargs="+", default=list(STYLES))
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from engine.config import EngineConfig
    from engine.loading.loader import resolve_model_folder
    from engine.lora.shipped import SHIPPED

    model = EngineConfig().model
    folder = resolve_model_folder(model, lambda *a: None)
    with tempfile.TemporaryDirectory() as tmp:
        for style in args.styles:
            src = args.src / style if args.src else Path(tmp) / style
            if not args.src:
                subprocess.run(["inferlab", "train-lora", "--style", style, "--threads", "1", "--out", str(src)],
                               check=True)
            ship(src, SHIPPED / folder.name / style, BASE_MODEL)
            print(f"shipped {style} -> {SHIPPED / folder.name / style}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
