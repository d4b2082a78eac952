"""Where inferlab keeps its files: platformdirs' folders where it is installed, else the XDG ones.

platformdirs is a dependency of the desktop install, but the lent GPU machines have no copy of it, and a
bench must not die on a folder name: without it the cache is $XDG_CACHE_HOME/inferlab (default
~/.cache/inferlab) and the data $XDG_DATA_HOME/inferlab (default ~/.local/share/inferlab), which is
what platformdirs itself answers on Linux.
"""
from __future__ import annotations

import os
from pathlib import Path

_XDG = {"cache": ("XDG_CACHE_HOME", ".cache"), "data": ("XDG_DATA_HOME", ".local/share")}


def user_dir(kind: str) -> Path:
    """inferlab's per-user folder of `kind` ("cache" or "data"); nothing is created."""
    if kind not in _XDG:
        raise ValueError(f"kind must be 'cache' or 'data', got {kind!r}")
    try:
        import platformdirs
    except ImportError:
        variable, default = _XDG[kind]
        base = os.environ.get(variable) or str(Path.home() / default)
        return Path(base) / "inferlab"
    return Path(platformdirs.user_cache_dir("inferlab") if kind == "cache" else platformdirs.user_data_dir("inferlab"))
