"""Loading a built module: where torch's extension cache keeps a build, and importing one only where it is
whole (the digest its build wrote when it finished; an ELF check for builds older than digests). A damaged
module would not fail to import: it would kill the process (SIGBUS) on every start."""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path


def import_built(name: str, locked: bool = False):
    """The module built earlier under this name (its name holds the sources' digest, so a built one is
    current), imported straight from torch's extension cache; None where there is none. torch's `load`
    takes a lock on the build folder even to find a build up to date, and a process killed meanwhile
    leaves it behind: loading what is built needs no lock.

    A damaged module (a build killed while linking, a full disk, a file changed since) would not fail to
    load: it kills the process (SIGBUS), on every start. So outside the machine build lock (`locked`
    False) only a module whose digest was written when its build finished is loaded (one being built by
    another process has none yet); under it, where no build runs, one without a digest (built before
    digests were written) is loaded where its ELF structure is whole, and a damaged one is removed, saying
    so, for the build to make again."""
    import importlib.util

    try:
        import torch  # noqa: F401 (the extension links against torch's libraries: load them first)

        so = build_dir(name) / f"{name}.so"
        if not so.is_file():
            return None
        state = _digest_state(so)
        if state != "verified":
            if not locked:
                return None
            if state == "damaged" or not _binary_whole(so):
                _discard_damaged(so)
                return None
        spec = importlib.util.spec_from_file_location(name, so)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if state != "verified":
            write_digest(so)
        return module
    except Exception:  # noqa: BLE001 (anything odd: build it again, and say what the build finds)
        return None


def _digest_path(so: Path) -> Path:
    return so.with_name(so.name + ".inferlab-sha256")


def _file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_state(so: Path) -> str:
    """"verified" (the digest written when its build finished matches), "damaged" (it does not), or
    "unverified" (none written: built by an older inferlab, or a build still under way)."""
    try:
        written = _digest_path(so).read_text().strip()
    except OSError:
        return "unverified"
    return "verified" if written == _file_digest(so) else "damaged"


def write_digest(so: Path) -> None:
    try:
        tmp = _digest_path(so).with_suffix(".tmp")
        tmp.write_text(_file_digest(so) + "\n")
        tmp.replace(_digest_path(so))
    except OSError:
        pass  # a read-only cache: the module is loaded under the lock each time, as before


_ELF_MAGIC = b"\x7fELF"
_MACHO_MAGICS = (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe")


def _binary_whole(path: Path) -> bool:
    """Whether a built binary is whole as far as its own headers say: for 64-bit little-endian ELF (Linux
    on x86-64 and AArch64) the header tables and every segment and section with contents lie inside the
    file (a truncated build fails). Mach-O (macOS) passes: its digest alone guards it. Anything else, or
    a file too short for a header (a zero-filled or emptied file), fails."""
    import struct

    try:
        data = path.read_bytes()
    except OSError:
        return False
    size = len(data)
    if size < 64:
        return False
    if data[:4] in _MACHO_MAGICS:
        return True
    if data[:4] != _ELF_MAGIC:
        return False
    if data[4] != 2 or data[5] != 1:  # not ELF64 little-endian: nothing here reads its layout
        return True
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return False
    for i in range(phnum):
        offset, filesz = struct.unpack_from("<Q16xQ", data, phoff + i * phentsize + 8)
        if offset + filesz > size:
            return False
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, length = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        if sh_type != 8 and offset + length > size:  # 8: SHT_NOBITS (.bss) has no bytes in the file
            return False
    return True


def _discard_damaged(so: Path) -> None:
    """Remove a damaged module, its digest, and any object file beside it that is damaged too, so that the
    build makes them again (a whole object file is kept: the build only links again)."""
    removed = []
    for path in [so, *sorted(so.parent.glob("*.o"))]:
        if path == so or not _binary_whole(path):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    with contextlib.suppress(OSError):
        _digest_path(so).unlink()
    warnings.warn(f"native kernels: the built module {so} was damaged (cut short, or changed since it was built); "
                  f"removed {', '.join(removed)} to build it again", stacklevel=5)


def build_dir(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def is_built(name: str) -> bool:
    """Whether torch's extension cache already holds this module (then loading it takes a moment)."""
    try:
        return (build_dir(name) / f"{name}.so").is_file()
    except Exception:  # noqa: BLE001 (a private helper of torch's: if it moves, say "building")
        return False
