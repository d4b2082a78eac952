"""`--record OUT` and `--record-limit MB`, for the app, serve, bench and prepare."""
from __future__ import annotations

import argparse

from app.record.writer import DEFAULT_MAX_BYTES


def _megabytes(text: str) -> int:
    try:
        mb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected megabytes, got {text!r}") from None
    if not 1 <= mb <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text}: expected 1 to 1,000,000 MB")
    return int(mb * 2**20)


def add_record_args(p: argparse.ArgumentParser, what: str = "the run") -> None:
    p.add_argument("--record", metavar="OUT", default=None,
                   help=f"record {what} to OUT (.inferlab-run: every step, token, snapshot and knob change); "
                        "`inferlab --replay OUT` plays it in the app's panels, on any machine")
    p.add_argument("--record-limit", metavar="MB", type=_megabytes, default=DEFAULT_MAX_BYTES,
                   help=f"with --record: stop recording when the file reaches this size "
                        f"(default {DEFAULT_MAX_BYTES // 2**20} MB)")
