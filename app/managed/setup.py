"""What a managed server runs, found before it starts: its executable and what it loads per weight format.

Shared by `inferlab tune` (app/tradeoff/tune_cli.py) and `inferlab --manage` (app/managed/args.py). Formats
are named (app/managed/formats.py). For llama-server a GGUF per format (--gguf-dir's files, each by the file
type its header says, else by its name; else --model's weights converted once, with their Q8_0 / Q4_1 / ...
variants; app/managed/gguf.py), the draft model being the smallest GGUF of the same model (the same
vocabulary); other engines get --model as their bf16 checkpoint (their table decides how to quantize it).
--weights NAME=PATH overrides either. What goes wrong is a SetupError: one line, said before any server starts.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.managed.formats import REFERENCE, SERVER_FORMAT_BY_NAME, formats_for, server_format
from app.managed.table import ServedModel, ServerEngine

# a --gguf-dir file whose header says no file type: its format by its name, longest names first (bf16 before f16)
_BY_NAME = sorted(formats_for("llama-server"), key=len, reverse=True)


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


def gguf_dir_files(folder: str) -> dict[str, str]:
    """{format: file} for --gguf-dir's GGUFs: each by the file type it says (else its name); the first file
    (by name) of a format wins."""
    from app.managed.gguf import gguf_file_format, is_gguf

    files = sorted(Path(folder).glob("*.gguf"))
    if not files:
        raise SetupError(f"--gguf-dir {folder}: no .gguf files")
    bad = [f.name for f in files if not is_gguf(f)]
    if bad:  # said now, not as every point's failed load
        raise SetupError(f"--gguf-dir {folder}: not a GGUF file (no GGUF magic): {', '.join(bad)}")
    out: dict[str, str] = {}
    for f in files:
        fmt = gguf_file_format(f) or next((n for n in _BY_NAME if n in f.name.lower()), None)
        if fmt is not None:
            out.setdefault(fmt, str(f))
    return out


def smallest(by_format: dict[str, str]) -> str | None:
    """The GGUF with the fewest bits per weight: the draft model (same model, same vocabulary)."""
    rows = [SERVER_FORMAT_BY_NAME[f] for f in by_format if f in SERVER_FORMAT_BY_NAME and f != REFERENCE]
    return by_format[min(rows, key=lambda r: r.bits_per_weight).name] if rows else None


def served_model(args, engine: ServerEngine, say) -> tuple[ServedModel, str]:
    """(what the server loads per weight format and as draft, a note on the draft model)."""
    from engine.loading.errors import ModelLoadError

    given = parse_weights(args.weights, engine.name)  # before any conversion: what they name is not converted
    llama = engine.name == "llama-server"
    drafting = llama and any(args.draft)
    # the draft is the smallest GGUF: converted too when drafting (q4_1, the model's own Q4_1 weights)
    needed = (set(args.formats) | ({"q4_1"} if drafting and not smallest(given) else set())) - set(given)
    if llama and args.gguf_dir:
        by_format = gguf_dir_files(args.gguf_dir)
    elif llama and needed:
        from app.managed.gguf import gguf_variants
        from engine.loading.loader import resolve_model_folder

        try:
            folder = resolve_model_folder(args.model, lambda message, fraction: None)
            by_format = {f: str(p) for f, p in gguf_variants(str(folder), tuple(sorted(needed)), say=say).items()}
        except (ModelLoadError, OSError, ValueError) as exc:
            raise SetupError(f"model {args.model}: {exc}") from None
    else:
        by_format = {} if llama else {REFERENCE: args.model}
    by_format.update(given)
    draft = smallest(by_format) if drafting else None
    note = (f"the smallest GGUF of the same model (same vocabulary): {Path(draft).name}" if draft else
            "no draft model" if llama else "the engine's own draft method (its table)")
    return ServedModel(by_format=by_format, draft=draft, name=Path(args.model).name or args.model), note


def parse_weights(items: list[str], engine: str | None = None) -> dict[str, str]:
    """--weights NAME=PATH items -> {format: path}; SetupError naming the formats for a bit count or an
    unknown name (a bit count names no format: q4_0 and q4_1 are both 4 bits)."""
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise SetupError(f"--weights {item!r}: expected FORMAT=PATH, e.g. q8_0=/models/m-q8_0.gguf")
        if name.isdigit():
            raise SetupError(f"--weights {item!r}: weights are named by format now, not bits: e.g. "
                             f"q4_1={path} (the formats: {', '.join(formats_for(engine))})")
        try:
            out[server_format(name, engine).name] = path
        except ValueError as exc:
            raise SetupError(f"--weights {item!r}: {exc}") from None
    return out
