"""Stored comparisons belong to the run that made them: a profile per speaker (or talk), and a record of
each `inferlab prepare`, so that the app says when what it shows is not what that prepare measured.

    inferlab prepare --profile talk     ->  <data dir>/profiles/talk/comparisons/<machine>/<model>/...
    inferlab --profile talk             ->  reads the same folder
    (no --profile: <data dir>/comparisons/..., as before; $INFERLAB_PROFILE does the same as the flag)

The data dir is $INFERLAB_DATA_DIR, else the platform's user data folder ($XDG_DATA_HOME/inferlab on
Linux). Beside the results, `prepare` writes prepared.json: when it ran, as whom (user@host, pid), the
profile, and each preset's result file digest. The app compares the file it shows with that record:
a result measured again since (M in the app, another run writing the same profile) or one that prepare
never wrote is named on the panel, with when and by whom the last prepare ran.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
import uuid
from datetime import datetime, timezone
from pathlib import Path

from app.data_dir import data_root

PROFILE_ENV = "INFERLAB_PROFILE"
MANIFEST = "prepared.json"
MAX_MANIFEST_BYTES = 1 * 2**20  # a record of a few dozen presets is a few KiB; a larger file is not read
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_profile(name: str) -> str:
    """A profile name (a folder name: letters, digits, '_', '.', '-'; at most 64); ValueError otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"profile {name!r}: expected 1-64 letters, digits, '_', '.' or '-' (not starting with "
                         "'.', '_' or '-')")
    return name


def active_profile() -> str | None:
    """The profile of this process: --profile (which sets $INFERLAB_PROFILE), else none."""
    name = os.environ.get(PROFILE_ENV) or None
    return None if name is None else check_profile(name)


def use_profile(name: str | None) -> None:
    """Make `name` this process's profile (and its children's: prepare's background compiles)."""
    if name is None:
        os.environ.pop(PROFILE_ENV, None)
    else:
        os.environ[PROFILE_ENV] = check_profile(name)


def profile_root() -> Path:
    name = active_profile()
    return data_root() if name is None else data_root() / "profiles" / name


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def read_manifest(folder: Path) -> dict | None:
    """The last prepare's record in `folder` (a machine/model folder of the store), or None when there is
    none or it is not one (too large, not JSON, the wrong shape: never trusted beyond its shape)."""
    path = folder / MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    presets = doc.get("presets")
    texts = all(isinstance(doc.get(k), str) for k in ("prepare_id", "prepared_at", "by"))
    def entry_ok(v) -> bool:
        return isinstance(v, dict) and isinstance(v.get("sha256"), str)

    if not texts or not isinstance(presets, dict) or not all(entry_ok(v) for v in presets.values()):
        return None
    return doc


def record_prepare(written: dict[str, Path], profile: str | None) -> None:
    """After `prepare`: record each result file it wrote (its digest), per machine/model folder, over the
    record of an earlier prepare (a `--preset X` run updates X's entry and keeps the others')."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run = {"prepare_id": uuid.uuid4().hex, "prepared_at": now, "by": f"{_user()}@{socket.gethostname()}",
           "pid": os.getpid(), "profile": profile}
    folders: dict[Path, dict[str, Path]] = {}
    for name, path in written.items():
        folders.setdefault(path.parent, {})[name] = path
    for folder, files in folders.items():
        entries = dict((read_manifest(folder) or {}).get("presets", {}))
        entries.update({name: {"sha256": _digest(path) or "", "prepare_id": run["prepare_id"], "prepared_at": now}
                        for name, path in files.items()})
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps({**run, "presets": entries}, indent=1), encoding="utf-8")
        tmp.replace(folder / MANIFEST)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def changed_since_prepare(result_path: Path, preset_name: str) -> str | None:
    """Why the stored result at `result_path` is not what the last prepare there wrote, in words for the
    panel; None when it is (or no prepare ever ran there: nothing to compare with)."""
    manifest = read_manifest(result_path.parent)
    if manifest is None:
        return None
    last = f"the last `inferlab prepare` ({manifest['prepared_at'][:16].replace('T', ' ')} UTC, {manifest['by']})"
    entry = manifest["presets"].get(preset_name)
    if entry is None:
        return f"⚠ not measured by {last}"
    if _digest(result_path) != entry["sha256"]:
        return f"⚠ measured again since {last}"
    return None
