"""`inferlab train-mtp`: train the model's multi-token prediction heads (engine/spec/mtp_train.py)."""
from __future__ import annotations

import argparse
import json
import sys

from app.device_args import device_options


def bounded(kind: type, low: float, high: float | None = None, low_open: bool = False):
    """An argparse type: a number of `kind` in [low, high] ((low, high] with low_open); a clear error else."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or (value <= low if low_open else value < low) or (high is not None and value > high):
            where = f"{'above' if low_open else 'at least'} {low}"
            where += f" and at most {high}" if high is not None else ""
            raise argparse.ArgumentTypeError(f"expected a value {where}, got {text}")
        return value
    return parse


def add_train_mtp_args(p: argparse.ArgumentParser, engine_args) -> None:
    from engine.spec.draft_length import MAX_DRAFT  # torch-free: the CLI's parser is built for every command

    engine_args(p)
    p.add_argument("--heads", type=bounded(int, 1, MAX_DRAFT), default=3,
                   help=f"prediction heads (tokens 2, 3, … ahead; 1-{MAX_DRAFT})")
    p.add_argument("--max-tokens", type=bounded(int, 1, 4096), default=96, help="length of each self-written answer")
    p.add_argument("--prompts", type=bounded(int, 0), default=128,
                   help="train on the first N prompts of assets/mtp_prompts.txt (0: all 256, what the shipped "
                        "heads used; writing the answers is most of the time)")
    p.add_argument("--epochs", type=bounded(int, 1), default=8,
                   help="at most; training stops once the held-out loss stops improving")
    p.add_argument("--lr", type=bounded(float, 0.0, 1.0, low_open=True), default=3e-3)
    p.add_argument("--rank", type=bounded(int, 1), default=None,
                   help="low-rank heads (e.g. 128); default: full matrices")
    p.add_argument("--weight-decay", type=bounded(float, 0.0), default=0.0)
    p.add_argument("--no-continuations", dest="continuations", action="store_false",
                   help="train on the chat answers only (default: also the model's plain-text continuations of the "
                        "prompts, the kind of text the talk's workloads have it write; twice the writing time)")
    p.add_argument("--self-prompts", type=bounded(int, 0), default=0,
                   help="also train on N openings the model writes itself (sampled), continued greedily: more text "
                        "of its own kind, ~0.15 s of writing each on 2 cores (default 0; the shipped heads: 0)")
    p.add_argument("--sequential", action="store_true",
                   help="each head also reads the token the head before it drafted (a chain, as the verify checks "
                        "it): heads 2 and 3 held out 29 / 25 %% right against 19 / 12 %% "
                        "(docs/measurements/speculative.md), for a second product per head when proposing")
    p.add_argument("--text", default=None, metavar="PATH",
                   help="keep the written training text in this file and reuse it when it is there, written with the "
                        "same settings: train again with other options without writing it again")
    p.add_argument("--out", default=None, help="where to save (default: the user cache, where the engine looks)")


def training_progress(message: str, fraction: float | None) -> None:
    """One line on stderr, rewritten in place: the training commands' progress."""
    pct = "" if fraction is None else f"{100 * fraction:5.1f}% "
    print(f"\r{pct}{message:<70}", end="", file=sys.stderr, flush=True)


def training_engine(args: argparse.Namespace):
    """The engine the training commands (train-mtp, train-lora) have the model write its answers with:
    a large batch, so the self-written training text comes quickly."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=args.threads,
                                  max_num_seqs=32, max_num_batched_tokens=2048), progress=training_progress)


def run_train_mtp(args: argparse.Namespace) -> int:
    from engine.spec.mtp_train import default_prompts, train_mtp

    progress = training_progress
    engine = training_engine(args)
    prompts = default_prompts()[: args.prompts] if args.prompts else None  # None: all of them
    report = train_mtp(engine, num_heads=args.heads, prompts=prompts, max_tokens=args.max_tokens,
                       epochs=args.epochs, lr=args.lr, rank=args.rank, weight_decay=args.weight_decay, out=args.out,
                       continuations=args.continuations, self_prompts=args.self_prompts,
                       sequential=args.sequential, text=args.text, progress=progress)
    print(file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0
