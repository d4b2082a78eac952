"""Errors shared by the model loading modules."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Progress = Callable[[str, float], None]


class ModelLoadError(RuntimeError):
    """The model could not be found, fetched, converted or read."""


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
