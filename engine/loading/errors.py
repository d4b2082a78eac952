"""Errors shared by the model loading modules."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Progress = Callable[[str, float], None]


class ModelLoadError(RuntimeError):
    """The model could not be found, fetched, converted or read."""


def read_json(path: Path, lenient: bool = False) -> dict[str, Any]:
    """A JSON object from `path`, {} where there is no such file. One that is not a JSON object (junk, cut
    short, a list) is a ModelLoadError naming it; `lenient`: {} instead (inferlab's own markers: a damaged
    one means "not current", and the work is done again)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        if lenient:
            return {}
        raise ModelLoadError(f"{path}: not a readable JSON file ({e})") from e
    if not isinstance(data, dict):
        if lenient:
            return {}
        raise ModelLoadError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
