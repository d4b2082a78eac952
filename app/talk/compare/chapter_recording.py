"""A chapter's measured runs, recorded while `prepare` runs its comparison (app/record/), and stored beside
the comparison: on stage, P plays it where the live run cannot hold ("recorded on <machine>, <date>").

The file carries the comparison too (a channel.ComparisonResult at its end), so a recording taken to another
machine shows the comparison measured with it."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from app.record.engine_recorder import EngineRecorder
from app.source import channel
from app.talk.compare.store import recording_path


class ChapterRecording:
    def __init__(self, preset_name: str, model: str, device: str, threads: int | None, max_bytes: int) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f"inferlab-{preset_name}-", suffix=".inferlab-run")
        os.close(fd)
        self.preset_name, self.model, self.tmp = preset_name, model, Path(tmp)
        self.recorder = EngineRecorder(self.tmp, what=f"inferlab prepare: {preset_name}", model=model, device=device,
                                       threads=threads, max_bytes=max_bytes, preset=preset_name)

    def keep(self, result: dict, copy_to: str | None = None) -> Path:
        """Close it with the comparison at its end, beside the stored result; a copy in `copy_to` (a folder)."""
        self.recorder.put(channel.ComparisonResult(self.preset_name, result))
        self.recorder.close()
        path = recording_path(self.preset_name, self.model, result["machine"])
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.tmp), path)
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(copy_to) / path.name)
        return path

    def discard(self) -> None:
        self.recorder.close()
        self.tmp.unlink(missing_ok=True)
