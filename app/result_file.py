"""Where a command's results go: checked before the work (a folder that does not exist is said at once,
not after minutes of measuring), written after it, and never lost: if the file cannot be written then,
the text goes to stdout with one line saying why."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def unwritable(outputs: dict[str, str | None]) -> str | None:
    """`--flag path` for each output whose folder does not exist or cannot be written; None when all can."""
    bad = []
    for flag, out in outputs.items():
        if not out:
            continue
        folder = Path(out).expanduser().resolve().parent
        if not folder.is_dir():
            bad.append(f"--{flag} {out}: no such folder")
        elif not _can_write(folder):
            bad.append(f"--{flag} {out}: the folder cannot be written")
    return "; ".join(bad) or None


def _can_write(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def write_or_print(path: str, text: str, who: str) -> bool:
    """Write `text` to `path`; where that fails, print it on stdout and say why on stderr (False)."""
    try:
        Path(path).expanduser().write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        return True
    except OSError as exc:
        print(f"{who}: could not write {path} ({exc}); the result follows on stdout", file=sys.stderr, flush=True)
        print(text)
        return False
