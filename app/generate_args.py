"""`inferlab generate`'s flags and what they become: the prompt (from --prompt, --prompt-file or stdin),
the messages sent through the chat template (--system), the engine knobs shared with `serve` (weight bits,
KV dtype, speculation: app/knob_args.py) and one LoRA adapter (--lora NAME or NAME=PATH)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.knob_args import add_knob_args

MAX_PROMPT_BYTES = 8 * 2**20  # a prompt file or stdin larger than this is refused, not read into memory whole


def add_generate_args(gen: argparse.ArgumentParser, engine_args) -> None:
    engine_args(gen)
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", default=None,
                        help="the prompt ('-': read it from stdin; default: stdin when it is not a terminal)")
    source.add_argument("--prompt-file", default=None, metavar="PATH", help="read the prompt from a file")
    gen.add_argument("--system", default=None, metavar="TEXT",
                     help="a system message before the prompt (through the chat template)")
    gen.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set of tokens "
                     "whose probabilities reach P (1: off)")
    gen.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest tokens (0: off)")
    gen.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: a random one)")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true",
                     help="require the model's chat template (the default where the model has one)")
    gen.add_argument("--raw", action="store_true", help="send the prompt as it is, without the chat template")
    gen.add_argument("--lora", default=None, metavar="NAME[=PATH]",
                     help="answer with a LoRA adapter: a name `inferlab train-lora` saved or shipped for this "
                          "model (shout, pirate, bullets for the built-in one), or NAME=PATH of a PEFT folder")
    add_knob_args(gen)  # --quant-bits (--quant), --quant-group-size, --kv-cache-dtype, --spec-method, ...
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object at the end (text, token ids, finish reason, timings) instead "
                          "of streaming the text")
    gen.add_argument("--stats", action="store_true", help="print timings to stderr at the end")


def read_prompt(args, stdin=None) -> str:
    """The prompt text: --prompt, --prompt-file, or stdin ('--prompt -', or no prompt flag and stdin not a
    terminal). ValueError says what is missing or unreadable."""
    stdin = stdin if stdin is not None else sys.stdin
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        try:
            if path.stat().st_size > MAX_PROMPT_BYTES:
                raise ValueError(f"--prompt-file {path}: larger than {MAX_PROMPT_BYTES // 2**20} MiB")
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--prompt-file {path}: {exc}") from None
    if args.prompt is None and stdin.isatty():
        raise ValueError("no prompt: give --prompt TEXT, --prompt-file PATH, or pipe it on stdin")
    text = stdin.read(MAX_PROMPT_BYTES + 1)
    if len(text) > MAX_PROMPT_BYTES:
        raise ValueError(f"the prompt on stdin is larger than {MAX_PROMPT_BYTES // 2**20} MiB")
    text = text.rstrip("\n")  # `echo hi |` ends in a newline the prompt did not mean
    if not text:
        raise ValueError("the prompt on stdin is empty")
    return text


def chat_messages(text: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def lora_choice(spec: str | None) -> tuple[str, str | None] | None:
    """--lora NAME or NAME=PATH as (name, path or None: found by name for the model); None without it."""
    if spec is None:
        return None
    name, sep, path = spec.partition("=")
    if not name or (sep and not path):
        raise ValueError(f"--lora wants NAME or NAME=PATH, got {spec!r}")
    return name, (path or None)


def find_lora(model_path: str, name: str) -> str:
    from engine.lora.shipped import available_adapters

    found = available_adapters(model_path)
    if name not in found:
        have = ", ".join(sorted(found)) or "none"
        raise ValueError(f"--lora {name}: no adapter of that name for this model (found: {have}); give NAME=PATH")
    return str(found[name])
