"""Before Qt starts: say which system library its platform plugin lacks, instead of letting Qt abort.

On a fresh Debian/Ubuntu machine `pip install PySide6` brings Qt but not the X11 libraries its xcb
platform plugin links to; Qt then aborts with "Could not load the Qt platform plugin "xcb"" (and, since
Qt 6.5, a hint about libxcb-cursor0 only). `ldd` on the plugin lists every library it cannot find,
directly or through libQt6XcbQpa, so the message can name them all and the one apt line that installs them.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# soname prefix -> the Debian/Ubuntu package that ships it
DEBIAN_PACKAGES = {
    "libxcb-cursor": "libxcb-cursor0", "libxcb-icccm": "libxcb-icccm4", "libxcb-keysyms": "libxcb-keysyms1",
    "libxcb-image": "libxcb-image0", "libxcb-render-util": "libxcb-render-util0", "libxcb-randr": "libxcb-randr0",
    "libxcb-shape": "libxcb-shape0", "libxcb-xfixes": "libxcb-xfixes0", "libxcb-xkb": "libxcb-xkb1",
    "libxcb-shm": "libxcb-shm0", "libxcb-sync": "libxcb-sync1", "libxcb-xinerama": "libxcb-xinerama0",
    "libxcb-render": "libxcb-render0", "libxcb-util": "libxcb-util1", "libxcb.so": "libxcb1",
    "libxkbcommon-x11": "libxkbcommon-x11-0", "libxkbcommon": "libxkbcommon0", "libX11-xcb": "libx11-xcb1",
    "libX11": "libx11-6", "libEGL": "libegl1", "libGL": "libgl1", "libOpenGL": "libopengl0",
    "libfontconfig": "libfontconfig1", "libfreetype": "libfreetype6", "libdbus-1": "libdbus-1-3",
    "libglib-2.0": "libglib2.0-0", "libICE": "libice6", "libSM": "libsm6",
}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.M)


def missing_libraries(ldd_output: str) -> list[str]:
    """The sonames `ldd` could not resolve, in order, without repeats."""
    return list(dict.fromkeys(_NOT_FOUND.findall(ldd_output)))


def package_for(soname: str) -> str | None:
    for prefix in sorted(DEBIAN_PACKAGES, key=len, reverse=True):
        if soname.startswith(prefix):
            return DEBIAN_PACKAGES[prefix]
    return None


def xcb_plugin() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    plugin = Path(next(iter(spec.submodule_search_locations))) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.exists() else None


def platform_problem(environ=os.environ) -> str | None:
    """Why the window cannot open here, in words a user can act on; None when nothing is known wrong."""
    if not sys.platform.startswith("linux"):
        return None
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform and not platform.startswith("xcb"):
        return None  # offscreen, wayland, vnc...: Qt's own checks apply
    if not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY"):
        return ("no display to open a window on (DISPLAY is not set). Run inferlab in a desktop session, "
                "or headless: `inferlab --screenshot OUT.png --preset NAME`")
    plugin, ldd = xcb_plugin(), shutil.which("ldd")
    if plugin is None or ldd is None or not environ.get("DISPLAY"):
        return None  # no plugin file to read, or a Wayland session
    out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20).stdout
    missing = missing_libraries(out)
    if not missing:
        return None
    packages = sorted({p for p in map(package_for, missing) if p})
    fix = f"\n  sudo apt-get install -y {' '.join(packages)}" if packages else ""
    return f"Qt's X11 (xcb) platform plugin needs system libraries that are missing: {', '.join(missing)}{fix}"
