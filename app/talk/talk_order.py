"""The talk's order in data: presets/talk.toml, one [[chapter]] per preset (its file name) with an optional
title, the talk's question. PgDown / PgUp, the Presets menu, `inferlab prepare` and the tests read it.

Read through the bounded file reader (engine/files.py). A talk.toml that lies (a preset that is not in the
folder, one named twice, an unknown key, not TOML, a FIFO or a huge file) is one PresetError line naming
the file, the line and the key. A folder without a talk.toml (one's own presets) is walked by file name;
a preset file the talk does not list comes after its chapters, by file name.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from app.talk.compare.toml_lines import compare_line
from app.talk.preset_error import PresetError
from engine.files import UnreadableFile, parse_toml, read_text, shown

TALK_FILE = "talk.toml"
CHAPTER_KEYS = ("preset", "title")
MAX_TITLE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Talk:
    names: tuple[str, ...]  # every preset of the folder: the talk's chapters in order, then the others
    chapters: tuple[str, ...] = ()  # the presets talk.toml lists, in its order
    titles: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # chapter titles by preset


def preset_files(presets_dir: Path) -> list[str]:
    """The presets of a folder by file name (talk.toml is not one)."""
    return sorted(p.stem for p in presets_dir.glob("*.toml") if p.name != TALK_FILE)


def load_talk(presets_dir: Path) -> Talk:
    """The folder's presets in the talk's order, with the chapters' titles; PresetError when talk.toml lies."""
    files = preset_files(presets_dir)
    chapters = _read_chapters(presets_dir / TALK_FILE, files)
    order = [name for name, _ in chapters]
    titles = {name: title for name, title in chapters if title is not None}
    return Talk(tuple(order + [n for n in files if n not in order]), tuple(order), MappingProxyType(titles))


def load_talk_or_files(presets_dir: Path, say: Callable[[str], None]) -> Talk:
    """load_talk(), or, when talk.toml lies, the presets by file name after saying why in one line (the app
    keeps its window and every preset; the speaker sees what to fix)."""
    try:
        return load_talk(presets_dir)
    except PresetError as exc:
        say(f"{exc} (presets in file-name order until it is fixed)")
        return Talk(tuple(preset_files(presets_dir)))


def _read_chapters(path: Path, files: list[str]) -> list[tuple[str, str | None]]:
    try:
        text = read_text(path)
        data = parse_toml(path, text)
    except FileNotFoundError:
        return []
    except UnreadableFile as exc:
        raise PresetError(path, exc.line, "", exc.why) from None
    for key in data:
        if key != "chapter":
            raise PresetError(path, _top_line(text, key), "", f"unknown key {shown(key)}; expected [[chapter]] tables")
    table = data.get("chapter")
    if not isinstance(table, list) or not table or not all(isinstance(c, dict) for c in table):
        raise PresetError(path, _top_line(text, "chapter"), "", "expected one or more [[chapter]] tables "
                                                                "(preset = NAME, title = optional)")
    seen: dict[str, int] = {}
    return [_chapter(path, text, n, raw, files, seen) for n, raw in enumerate(table, 1)]


def _chapter(path: Path, text: str, n: int, raw: dict, files: list[str], seen: dict[str, int]):
    where = f"[[chapter]] #{n}"

    def fail(key: str | None, message: str) -> PresetError:
        return PresetError(path, compare_line(text, f"chapter #{n}", key), where, message)

    for key in raw:
        if key not in CHAPTER_KEYS:
            raise fail(key, f"unknown key {shown(key)}; expected preset and title")
    name = raw.get("preset")
    if not isinstance(name, str) or not name:
        raise fail("preset" if "preset" in raw else None, f"preset: expected a preset's name, got {shown(name)}")
    if name not in files:
        raise fail("preset", f"preset: no preset {shown(name)} in {path.parent} (have: {', '.join(files)})")
    if name in seen:
        raise fail("preset", f"preset: {shown(name)} is chapter {seen[name]} already")
    seen[name] = n
    title = raw.get("title")
    if title is not None and (not isinstance(title, str) or not title.strip() or "\n" in title
                              or len(title) > MAX_TITLE_CHARS):
        raise fail("title", f"title: expected one line of text (at most {MAX_TITLE_CHARS} characters), got "
                            f"{shown(title)}")
    return name, title.strip() if title is not None else None


def _top_line(text: str, key: str) -> int | None:
    """The line that opens `key`: `key = ...` or a [key] / [[key]] header."""
    pattern = re.compile(rf"^\s*(?:{re.escape(key)}\s*=|\[\[?\s*{re.escape(key)}\s*\]\]?)")
    return next((i for i, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None)
