"""What a managed server runs, found before it starts: its executable and what it loads per bit width.

Shared by `inferlab tune` (app/tradeoff/tune_cli.py) and `inferlab --manage` (app/managed/args.py). For
llama-server a GGUF per bit width (--gguf-dir's files, else --model's weights converted once, with their
Q8_0 / Q4_1 variants; app/managed/gguf.py), the draft model being the 4-bit GGUF of the same model (the same
vocabulary); other engines get --model (their table decides how to quantize it). --weights BITS=PATH
overrides either. What goes wrong is a SetupError: one line, said before any server starts.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.managed.table import ServedModel, ServerEngine

GGUF_NAMES = {16: ("bf16", "f16"), 8: ("q8_0",), 4: ("q4_1", "q4_0")}  # in --gguf-dir: bits -> name parts


class SetupError(ValueError):
    """What stops a managed server (or a tuning sweep) before any server starts (one line)."""


def find_executable(engine: ServerEngine, given: str | None) -> str:
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise SetupError(f"--server-bin {given}: not an executable file")
        return given
    if engine.name == "llama-server":
        from app.managed.gguf import find_binary, llama_cpp_dir

        built = find_binary("llama-server")
        if built is not None:
            return str(built)
        found = shutil.which(engine.executable)
        if found is None:
            raise SetupError(f"no llama-server in {llama_cpp_dir() / 'bin'} or on PATH: run "
                                 "scripts/build_llama_cpp.sh (or set INFERLAB_LLAMA_CPP_DIR to its build), or give "
                                 "--server-bin")
        return found
    if os.path.isabs(engine.executable):
        return engine.executable
    found = shutil.which(engine.executable)
    if found is None:
        raise SetupError(f"{engine.executable} is not on PATH: install {engine.name} or give --server-bin")
    return found


def gguf_dir_files(folder: str) -> dict[int, str]:
    files = sorted(Path(folder).glob("*.gguf"))
    if not files:
        raise SetupError(f"--gguf-dir {folder}: no .gguf files")
    out: dict[int, str] = {}
    for bits, parts in GGUF_NAMES.items():
        match = next((f for part in parts for f in files if part in f.name.lower()), None)
        if match is not None:
            out[bits] = str(match)
    from app.managed.gguf import is_gguf

    bad = [Path(f).name for f in out.values() if not is_gguf(Path(f))]
    if bad:  # said now, not as every point's failed load
        raise SetupError(f"--gguf-dir {folder}: not a GGUF file (no GGUF magic): {', '.join(bad)}")
    return out


def served_model(args, engine: ServerEngine, say) -> tuple[ServedModel, str]:
    """(what the server loads per bit width and as draft, a note on the draft model)."""
    from engine.loading.errors import ModelLoadError

    given = parse_weights(args.weights)  # before any conversion: what they name is not converted
    drafting = engine.name == "llama-server" and any(args.draft)
    needed = (set(args.bits) | ({4} if drafting else set())) - set(given)
    if engine.name == "llama-server" and args.gguf_dir:
        by_bits = gguf_dir_files(args.gguf_dir)
    elif engine.name == "llama-server" and needed:
        from app.managed.gguf import gguf_variants
        from engine.loading.loader import resolve_model_folder

        try:
            folder = resolve_model_folder(args.model, lambda message, fraction: None)
            by_bits = {b: str(p) for b, p in gguf_variants(str(folder), tuple(sorted(needed)), say=say).items()}
        except (ModelLoadError, OSError, ValueError) as exc:
            raise SetupError(f"model {args.model}: {exc}") from None
    else:
        by_bits = {} if engine.name == "llama-server" else {16: args.model}
    by_bits.update(given)
    draft = by_bits.get(4) if engine.name == "llama-server" and any(args.draft) else None
    note = (f"the 4-bit GGUF of the same model (same vocabulary): {Path(draft).name}" if draft else
            "no draft model" if engine.name == "llama-server" else "the engine's own draft method (its table)")
    return ServedModel(by_bits=by_bits, draft=draft, name=Path(args.model).name or args.model), note


def parse_weights(items: list[str]) -> dict[int, str]:
    out = {}
    for item in items:
        bits, sep, path = item.partition("=")
        if not sep or not bits.isdigit() or not path:
            raise SetupError(f"--weights {item!r}: expected BITS=PATH, e.g. 8=/models/m-q8_0.gguf")
        out[int(bits)] = path
    return out
