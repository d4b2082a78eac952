"""Errors shared by the model loading modules."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import files

Progress = Callable[[str, float], None]
MAX_CONFIG_BYTES = 16 * 2**20  # a model's JSON files (config, tokenizer_config with its template, index)


class ModelLoadError(RuntimeError):
    """The model could not be found, fetched, converted or read."""


def read_json(path: Path, lenient: bool = False) -> dict[str, Any]:
    """A JSON object from `path`, {} where there is no such file. One that is not a JSON object (junk, cut
    short, a list) is a ModelLoadError naming it; `lenient`: {} instead (inferlab's own markers: a damaged
    one means "not current", and the work is done again)."""
    try:  # a regular file, bounded in size and depth (engine/files.py)
        data = files.read_json(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        if lenient:
            return {}
        raise ModelLoadError(f"{path}: not a readable JSON file ({getattr(e, 'why', e)})") from e
    if not isinstance(data, dict):
        if lenient:
            return {}
        raise ModelLoadError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
