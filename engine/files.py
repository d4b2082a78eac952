"""The one way inferlab reads a file a user, a download or an earlier run left (presets, settings, stored
results, recordings, model and adapter configs): a regular file only, at most a size, nested at most a
depth, and any failure one short line naming the file (UnreadableFile).

Why: a preset path that was /dev/zero grew to 2 GB in 6 s, a FIFO hung the app, a TOML nested 50,000 deep
ended in a RecursionError traceback and a 1,000,000-element array gave a 4 MB error line. A file is
opened without blocking (a FIFO opens at once), and only then checked to be a regular file, on the open
descriptor itself (no window between a check and the open for a swap on disk); it is read up to its cap
plus one byte, whatever its size claims.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

MAX_TEXT_BYTES = 4 * 2**20  # a preset, a stored result, a config: kilobytes
MAX_DEPTH = 64  # nesting of a JSON or TOML document (ours go 5 deep)
MAX_SHOWN_CHARS = 80  # a value, as an error shows it


class UnreadableFile(ValueError):
    """A file that is not there to read as asked: not a regular file, too large, not text, not the format,
    nested too deep (the message: "PATH: what is wrong", one short line)."""

    def __init__(self, path: str | os.PathLike, why: str, line: int | None = None) -> None:
        self.path, self.why, self.line = str(path), why, line
        super().__init__(f"{path}: {why}")


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value` as an error line shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike, max_bytes: int | None = None) -> int:
    """The size of `path`, a regular file (of at most `max_bytes`), for a library that opens it itself
    (safetensors, tokenizers, gguf); UnreadableFile else. FileNotFoundError passes through."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableFile(path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(path, f"is {kind_of(info.st_mode)}, not a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise UnreadableFile(path, f"is {info.st_size:,} bytes, more than the {max_bytes:,} a file of its kind may be")
    return info.st_size


def read_bytes(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES, cut: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (`cut`: its first `max_bytes`, the rest
    unread); UnreadableFile else (FileNotFoundError passes through: callers treat an absent file as absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # (a FIFO with no writer, opened without blocking, on some systems)
            raise UnreadableFile(path, "is a FIFO (named pipe), not a regular file") from None
        raise UnreadableFile(path, f"cannot be read ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnreadableFile(path, f"is {kind_of(mode)}, not a regular file")
    with os.fdopen(fd, "rb", buffering=0) as f:
        data = bytearray()
        while len(data) <= max_bytes:
            piece = f.read(min(2**20, max_bytes + 1 - len(data)))
            if not piece:
                break
            data += piece
    if len(data) > max_bytes and cut:
        return bytes(data[:max_bytes])
    if len(data) > max_bytes:
        raise UnreadableFile(path, f"is larger than the {max_bytes:,} bytes a file of its kind may be")
    return bytes(data)


def read_text(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """read_bytes decoded as UTF-8; UnreadableFile naming the first byte that is not."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UnreadableFile(path, f"not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})",
                             line) from None


def read_json(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document from `path`, read by read_text, nested at most `max_depth`; UnreadableFile else."""
    text = read_text(path, max_bytes)
    try:
        data = json.loads(text)
    except RecursionError:
        raise UnreadableFile(path, f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise UnreadableFile(path, f"not valid JSON ({str(exc)[:120]})") from None
    _check_depth(path, data, max_depth)
    return data


def read_toml(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES, max_depth: int = MAX_DEPTH) -> dict:
    """A TOML document from `path`, read by read_text, nested at most `max_depth`; UnreadableFile else
    (its `line`: where the parser says, when it says)."""
    return parse_toml(path, read_text(path, max_bytes), max_depth)


def parse_toml(path: str | os.PathLike, text: str, max_depth: int = MAX_DEPTH) -> dict:
    """read_toml's parse of `text` (read from `path` by read_text, for a caller that needs the text too)."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise UnreadableFile(path, f"nested deeper than {max_depth} levels") from None
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise UnreadableFile(path, f"not valid TOML: {str(exc)[:160]}", int(line.group(1)) if line else None) from None
    _check_depth(path, data, max_depth)
    return data


def _check_depth(path, data: Any, max_depth: int) -> None:
    """UnreadableFile when `data` nests lists and objects deeper than `max_depth` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise UnreadableFile(path, f"nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
