"""Which `inferlab prepare` the app last showed, per store folder (profile, machine, model), kept in the
app's settings: when the store holds another one at the next start (a second prepare on this machine
wrote the same profile), the comparison panel says so, for the whole session, instead of showing the
other run's figures without a word (app/talk/compare/profile.py writes the record it reads)."""
from __future__ import annotations

import hashlib


class PrepareSeen:
    def __init__(self, settings) -> None:
        self._settings = settings  # None: nothing remembered (headless screenshots)
        self._at_start: dict[str, str | None] = {}  # per store: the id remembered before this session

    def note(self, result: dict | None) -> str | None:
        """The warning for `result` (a stored one, with "prepared" from compare_run.stored_result), or None;
        records the prepare it came from as the one shown."""
        prepared = (result or {}).get("prepared")
        if self._settings is None or not isinstance(prepared, dict):
            return None
        key = "prepare_seen/" + hashlib.sha256(str(prepared.get("store")).encode()).hexdigest()[:16]
        if key not in self._at_start:
            before = self._settings.value(key)
            self._at_start[key] = str(before) if before else None
            self._settings.setValue(key, str(prepared.get("id")))
        before = self._at_start[key]
        if before is None or before == prepared.get("id"):
            return None
        at = str(prepared.get("at", "?"))[:16].replace("T", " ")
        return f"⚠ prepared again ({at} UTC, {prepared.get('by', '?')}) since this app last showed these results"
