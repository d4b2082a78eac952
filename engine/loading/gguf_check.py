"""A GGUF file's layout checked against its own size before the `gguf` package reads it.

The package trusts every count in the file: an array that says 2^40 elements in a 92-byte file kept its
reader looping past 20 s, and a count past the end surfaced as "IndexError: index 0 is out of bounds".
Here each count, length and tensor extent is checked against the bytes that are really there (every
element takes at least one byte), walking the header once without recursion into Python's limits, and
what is wrong is said with the key or tensor it is in.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from engine import files
from engine.loading.errors import ModelLoadError

FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
STRING, ARRAY = 8, 9
MAX_ARRAY_DEPTH = 4
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_KEY_BYTES = 65536


class _Bad(ValueError):
    pass


class _Cursor:
    def __init__(self, data, start: int) -> None:
        self.data, self.at = data, start

    def take(self, n: int, what: str) -> int:
        """Skip `n` bytes of `what`: _Bad when the file ends first."""
        if n < 0 or self.at + n > len(self.data):
            raise _Bad(f"{what} needs {n:,} bytes at offset {self.at:,}, past the end of the file "
                       f"({len(self.data):,} bytes)")
        self.at += n
        return self.at - n

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.data, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.data, self.take(8, what))[0]

    def string(self, what: str, max_bytes: int | None = None) -> bytes:
        n = self.u64(what)
        if max_bytes is not None and n > max_bytes:
            raise _Bad(f"{what} is {n:,} bytes long")
        return bytes(self.data[self.take(n, what):self.at])

    def left(self) -> int:
        return len(self.data) - self.at


def check_gguf(path: Path) -> None:
    """ModelLoadError naming `path` and what is wrong when its header does not fit the file."""
    try:
        size = files.check_regular(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {getattr(exc, 'why', exc)}") from None
    if size < 24:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({size} bytes, shorter than GGUF's header); "
                             "truncated or corrupt? Download it again")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            _check(data)
        except _Bad as exc:
            raise ModelLoadError(f"{path}: not a readable GGUF file ({exc}); truncated or corrupt? Download it "
                                 "again") from None


def _check(data) -> None:
    if data[:4] != b"GGUF":
        raise _Bad(f"it begins with {bytes(data[:4])!r}, not GGUF's magic")
    c = _Cursor(data, 4)
    version = c.u32("the version")
    if version not in (2, 3):
        raise _Bad(f"GGUF version {version} (versions 2 and 3 are read)")
    n_tensors, n_kv = c.u64("the tensor count"), c.u64("the key count")
    if n_kv * 12 > c.left():  # a key takes at least its length (8) and its type (4)
        raise _Bad(f"it says {n_kv:,} keys, more than its {c.left():,} bytes can hold")
    alignment = 32
    for _ in range(n_kv):
        key = c.string("a key", MAX_KEY_BYTES).decode("utf-8", "replace")
        kind = c.u32(f"the type of {key!r}")
        value = _skip_value(c, kind, key)
        if key == "general.alignment" and kind == 4:
            alignment = value
    if not alignment or alignment & (alignment - 1):
        raise _Bad(f"general.alignment {alignment} is not a power of two")
    if n_tensors * 24 > c.left():  # a tensor's info takes at least 8 + 4 + 4 + 8 bytes
        raise _Bad(f"it says {n_tensors:,} tensors, more than its {c.left():,} bytes can hold")
    extents = [_tensor_info(c) for _ in range(n_tensors)]
    data_start = -(-c.at // alignment) * alignment
    for name, offset, nbytes in extents:
        if data_start + offset + nbytes > len(data):
            raise _Bad(f"tensor {name!r} ({nbytes:,} bytes at {offset:,}) lies past the end of the file")


def _skip_value(c: _Cursor, kind: int, key: str):
    """Skip one value of type `kind` (arrays nested at most MAX_ARRAY_DEPTH, walked with a stack); the
    value itself for a u32 (general.alignment), else None."""
    if kind in FIXED:
        at = c.take(FIXED[kind], f"the value of {key!r}")
        return struct.unpack_from("<I", c.data, at)[0] if kind == 4 else None
    if kind == STRING:
        c.take(c.u64(f"the length of {key!r}"), f"the text of {key!r}")
        return None
    if kind != ARRAY:
        raise _Bad(f"{key!r} has value type {kind}, which GGUF does not define")
    pending = [(1, 1)]  # (depth, arrays left at that depth): one array to read
    while pending:
        depth, left = pending.pop()
        if left > 1:
            pending.append((depth, left - 1))
        if depth > MAX_ARRAY_DEPTH:
            raise _Bad(f"{key!r} nests arrays deeper than {MAX_ARRAY_DEPTH}")
        item, count = c.u32(f"the item type of {key!r}"), c.u64(f"the length of {key!r}")
        least = FIXED.get(item, 8 if item == STRING else 12)
        if item not in FIXED and item not in (STRING, ARRAY):
            raise _Bad(f"{key!r} is an array of value type {item}, which GGUF does not define")
        if count * least > c.left():
            raise _Bad(f"{key!r} says {count:,} items, more than the {c.left():,} bytes left can hold")
        if item in FIXED:
            c.take(count * least, f"the items of {key!r}")
        elif item == STRING:
            for _ in range(count):
                c.take(c.u64(f"an item's length in {key!r}"), f"an item of {key!r}")
        elif count:
            pending.append((depth + 1, count))
    return None


def _tensor_info(c: _Cursor) -> tuple[str, int, int]:
    """(name, offset, bytes) of one tensor's info; _Bad for a shape or type that cannot be."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name = c.string("a tensor's name", MAX_KEY_BYTES).decode("utf-8", "replace")
    n_dims = c.u32(f"the dimensions of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Bad(f"tensor {name!r} has {n_dims:,} dimensions (1 to {MAX_DIMS})")
    dims = [c.u64(f"a dimension of {name!r}") for _ in range(n_dims)]
    kind = c.u32(f"the type of {name!r}")
    offset = c.u64(f"the offset of {name!r}")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise _Bad(f"tensor {name!r} has type {kind}, which this gguf package does not know") from None
    elements = 1
    for d in dims:
        elements *= d
    if not elements or dims[0] % block:
        raise _Bad(f"tensor {name!r} has shape {dims}: empty, or rows not whole blocks of {block}")
    return name, offset, elements // block * block_bytes
