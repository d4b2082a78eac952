"""Where inferlab keeps what it measured (sweeps, comparisons): the platform's user data dir, or
$INFERLAB_DATA_DIR (tests, portable installs); the XDG folder where platformdirs is missing."""
from __future__ import annotations

import os
from pathlib import Path

from engine.loading.user_dirs import user_dir


def data_root() -> Path:
    override = os.environ.get("INFERLAB_DATA_DIR")
    if override:
        return Path(override)
    return user_dir("data")
