"""`inferlab train-lora`: train a small LoRA adapter on the CPU from data it makes itself (engine/lora/train.py)."""
from __future__ import annotations

import argparse
import json
import sys


def add_train_lora_args(p: argparse.ArgumentParser, engine_args) -> None:
    from engine.lora.styles import STYLES

    engine_args(p)
    p.add_argument("--style", default="shout", choices=sorted(STYLES), help="the rewrite the adapter learns")
    p.add_argument("--out", default=None, help="the adapter folder to write (default: the user cache, where "
                   "the app finds it by the style's name)")
    p.add_argument("--prompts", type=int, default=64, help="instructions the model answers itself")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-tokens", type=int, default=48, help="length of each self-written answer")


def run_train_lora(args: argparse.Namespace) -> int:
    from app.train_mtp import training_engine, training_progress
    from engine.lora.shipped import trained_dir
    from engine.lora.train import train_lora
    from engine.spec.mtp_train import default_prompts

    progress = training_progress
    engine = training_engine(args)
    try:
        report = train_lora(engine, args.out or trained_dir(engine.model_path) / args.style, style=args.style,
                            prompts=default_prompts()[: args.prompts], rank=args.rank, epochs=args.epochs,
                            lr=args.lr, max_tokens=args.max_tokens, progress=progress)
    except ValueError as exc:
        print(f"\ninferlab: error: {exc}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0
