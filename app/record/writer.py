"""RecordingWriter: items into one `.inferlab-run` file, encoded and compressed in a thread of its own.

The file: line-delimited JSON, compressed as one stream (zstd where the pinned `zstandard` wheel is
installed, else gzip from the standard library; the reader tells them apart by their magic bytes). Line 1
is the header (app/record/header.py); then one line per item, {"t": seconds since the start, "k": its
class, "d": its fields} (app/record/codec.py); the last line {"k": "end"} says the file is whole, why it
stopped and how many items were dropped. The compressor is flushed every FLUSH_S, so a process killed
mid-run leaves a file that plays up to its last flush.

The thread that calls `put` (the engine's, inside a step) only appends the immutable item to a deque: it
never encodes or waits on the disk. Bounded: at most `max_bytes` on disk (the user's limit; then the
recording stops, saying so in its end line and on `stopped`), and at most MAX_QUEUED items waiting to be
written (beyond, new ones are dropped and counted).
"""
from __future__ import annotations

import gzip
import json
import threading
import time
from collections import deque
from pathlib import Path

from app.record.codec import encode

try:
    import zstandard
except ImportError:  # the GPU image has no zstandard: gzip, which every reader reads too
    zstandard = None  # type: ignore[assignment]

SUFFIX = ".inferlab-run"
DEFAULT_MAX_BYTES = 512 * 2**20
FLUSH_S = 1.0
MAX_QUEUED = 100_000
ZSTD_LEVEL = 3


def _compressor(raw, compression: str):
    if compression == "zstd":
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(raw, closefd=False)
    return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)


class RecordingWriter:
    def __init__(self, path: str | Path, header: dict, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 compression: str | None = None, clock=time.perf_counter) -> None:
        """Opens `path` for writing now (an unwritable path raises OSError here, not in the thread)."""
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self.compression = compression or ("zstd" if zstandard is not None else "gzip")
        if self.compression == "zstd" and zstandard is None:
            raise ValueError("zstd compression needs the zstandard package")
        self._clock = clock
        self.t0 = clock()
        self._raw = open(self.path, "wb")  # noqa: SIM115 (closed by the writer thread)
        self._out = _compressor(self._raw, self.compression)
        self._queue: deque = deque()
        self._wake = threading.Event()
        self._closing = False
        self.items = self.dropped = 0
        self.stopped: str | None = None  # why it stopped early ("size limit ..."), None while it records
        self.error: str | None = None
        self._write_line({k: v for k, v in header.items()})
        self._thread = threading.Thread(target=self._run, name="inferlab-record", daemon=True)
        self._thread.start()

    # --- any thread -------------------------------------------------------------------------------
    def put(self, item, t: float | None = None) -> None:
        """Record `item` (a registered channel item) as published at perf_counter `t` (default: now)."""
        if self.stopped is not None or self._closing:
            return
        if len(self._queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.append(((self._clock() if t is None else t) - self.t0, item))
        if len(self._queue) >= 256:
            self._wake.set()

    @property
    def size(self) -> int:
        """Bytes on disk so far (as of the last flush)."""
        try:
            return self._raw.tell() if not self._raw.closed else self.path.stat().st_size
        except (OSError, ValueError):
            return 0

    @property
    def seconds(self) -> float:
        return self._clock() - self.t0

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and the end line; the file is whole once this returns."""
        if self._closing:
            self._thread.join(timeout)
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        last_flush = self._clock()
        try:
            while True:
                self._wake.wait(FLUSH_S / 4)
                self._wake.clear()
                closing = self._closing
                self._write_queued()
                now = self._clock()
                if closing or self.stopped or now - last_flush >= FLUSH_S:
                    self._flush()
                    last_flush = now
                    if self.size > self.max_bytes and self.stopped is None:
                        self.stopped = f"size limit of {self.max_bytes / 2**20:.0f} MiB reached"
                if closing or self.stopped:
                    break
            self._write_line({"t": round(self.seconds, 6), "k": "end",
                              "d": {"items": self.items, "dropped": self.dropped + len(self._queue),
                                    "stopped": self.stopped}})
            self._queue.clear()
            self._out.close()
        except (OSError, ValueError) as exc:  # a full disk: the recording ends, the run goes on
            self.error = self.stopped = f"recording stopped: {exc}"
        finally:
            self._raw.close()

    def _write_queued(self) -> None:
        pop = self._queue.popleft
        while self._queue and self.stopped is None:
            t, item = pop()
            self._write_line({"t": round(t, 6), "k": type(item).__name__, "d": encode(item)})
            self.items += 1
            if self.items % 4096 == 0 and self.size > self.max_bytes:
                self._flush()
                if self.size > self.max_bytes:
                    self.stopped = f"size limit of {self.max_bytes / 2**20:.0f} MiB reached"

    def _write_line(self, obj: dict) -> None:
        self._out.write(json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n")

    def _flush(self) -> None:
        if self.compression == "zstd":
            self._out.flush(zstandard.FLUSH_BLOCK)
        else:
            self._out.flush()
        self._raw.flush()
