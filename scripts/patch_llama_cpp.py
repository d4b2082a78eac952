"""Patch the llama.cpp tree that scripts/build_llama_cpp.sh builds, so that the peer runs its best path on
Intel CPUs with AMX (Sapphire Rapids and later).

ggml's AMX matrix product (ggml/src/ggml-cpu/amx/mmq.cpp, ggml_tile_config_init) fills a tile configuration
on the stack and loads it with _tile_loadconfig. GCC 12 does not see that the builtin reads that memory and
drops the stores of the rows and column widths: the load gets a zeroed, partly uninitialised configuration,
and the first AMX product (a prompt, or several streams decoding, on Q4_0/Q4_1/Q8_0/K-quant weights) dies of
SIGSEGV (llama.cpp issue 20824; upstream's fix is the open PR 26954). This adds a compiler barrier before
the load so the stores stay; it changes no kernel and no result.

    python scripts/patch_llama_cpp.py SRC     # prints patched | kept (already patched) | absent (no such code)
"""
from __future__ import annotations

import sys
from pathlib import Path

MMQ = Path("ggml/src/ggml-cpu/amx/mmq.cpp")
MARKER = "inferlab build patch"
LOAD = "    _tile_loadconfig(&tc);\n    done = true;"
BARRIER = ("    // inferlab build patch: keep the stores to tc (GCC drops them; llama.cpp issue 20824, PR 26954)\n"
           '    __asm__ __volatile__("" : : "r"(&tc) : "memory");\n')


def patch_amx_tile_config(src: Path) -> str:
    """Apply the barrier to the tree at `src`: "patched" (changed now), "kept" (there already) or "absent"
    (the tree has no such code, e.g. another llama.cpp version: left as it is)."""
    path = src / MMQ
    text = path.read_text() if path.is_file() else ""
    if MARKER in text:
        return "kept"
    if text.count(LOAD) != 1:
        return "absent"
    path.write_text(text.replace(LOAD, BARRIER + LOAD))
    return "patched"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(patch_amx_tile_config(Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
