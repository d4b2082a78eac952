"""Where inferlab keeps what it measured (sweeps, comparisons): the platform's user data dir, or
$INFERLAB_DATA_DIR (tests, portable installs)."""
from __future__ import annotations

import os
from pathlib import Path


def data_root() -> Path:
    override = os.environ.get("INFERLAB_DATA_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("inferlab"))
