"""PresetError: what is wrong with a preset or the talk's order (presets/talk.toml), as one line naming the
file, the line and the key (path:line: [table] key: message)."""
from __future__ import annotations

from pathlib import Path

MAX_MESSAGE_CHARS = 300  # an error is one line: a value it quotes is cut (a 1,000,000-element array gave 4 MB)


class PresetError(ValueError):
    def __init__(self, path: Path | str, line: int | None, where: str, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        self.path, self.line, self.where, self.message = str(path), line, where, message
        loc = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{loc}: {where}: {message}" if where else f"{loc}: {message}")
