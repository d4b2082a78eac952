"""The user's settings (QSettings), opened only when their file is one inferlab can read.

QSettings reads its file itself, before any value is asked for: a FIFO there hung the app's start, and
/dev/zero or a huge file would be read whole. So the file Qt would open is checked first as every file
inferlab reads is (engine/files.py: a regular file of at most MAX_SETTINGS_BYTES); where it is not one,
the app starts with default settings in a scratch file, says so once, and saves nothing over it.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from engine.files import UnreadableFile, check_regular

MAX_SETTINGS_BYTES = 1 * 2**20  # a window layout, a theme, the last preset: a few kilobytes


def settings_path(organization: str, application: str) -> Path | None:
    """The file QSettings() reads on Linux and other XDG systems ($XDG_CONFIG_HOME/org/app.conf); None on
    macOS and Windows, whose native stores are not files Qt reads this way."""
    if sys.platform in ("darwin", "win32"):
        return None
    from PySide6.QtCore import QStandardPaths

    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return Path(base) / organization / f"{application}.conf" if base else None


def user_settings(organization: str = "inferlab", application: str = "inferlab"):
    """(QSettings, persist): the user's settings, or a scratch one (persist False) and a line on stderr
    where their file is not a small regular file."""
    from PySide6.QtCore import QSettings

    path = settings_path(organization, application)
    try:
        if path is not None:
            check_regular(path, MAX_SETTINGS_BYTES)
    except FileNotFoundError:
        pass  # a first start: Qt creates it
    except UnreadableFile as exc:
        print(f"inferlab: the settings file {exc}; starting with default settings (nothing is saved to it)",
              file=sys.stderr)
        scratch = Path(tempfile.mkdtemp(prefix="inferlab-settings-")) / "settings.ini"
        return QSettings(str(scratch), QSettings.Format.IniFormat), False
    return QSettings(), True
