"""Helpers for the managed-server tests on the vLLM/SGLang stand-in (tests/standin_server.py)."""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

STANDIN = Path(__file__).parent / "standin_server.py"


@dataclass(frozen=True, slots=True)
class Standin:
    """A stand-in executable for one engine and where it records each start's pid and argv."""
    exe: str
    record: Path

    def starts(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


def standin(tmp_path: Path, engine: str, mode: str = "", drop: tuple[str, ...] = ()) -> Standin:
    """Write an executable that stands where `vllm` (or SGLang's `python`) would: it sets the stand-in's
    environment and execs it (same pid, so the ManagedServer's process is the stand-in itself)."""
    exe = tmp_path / f"{engine}-standin"
    record = tmp_path / f"{engine}-starts.jsonl"
    env = {"STANDIN_EXE": str(exe), "STANDIN_RECORD": str(record), "STANDIN_MODE": mode,
           "STANDIN_DROP": ",".join(drop)}
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    exe.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} "
                   f"{engine} \"$@\"\n")
    exe.chmod(0o755)
    return Standin(str(exe), record)


def pid_alive(pid: int) -> bool:
    """Whether `pid` is still a process (ChildServer waits for the processes it stops, so a stopped or
    crashed server is gone, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the number
        return True
    return True
