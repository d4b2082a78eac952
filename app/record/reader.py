"""Reading a `.inferlab-run` file back: streamed, line by line, never whole.

    rec = open_recording(path)            # RecordingError: one line saying why it is not one
    for t, item in rec.items():           # seconds since the start, a channel item
        ...
    rec.cut_short                         # the file ended before its end line: a line saying so

Hostile files: anything that is not a regular file, not zstd or gzip, or whose first line is not an
inferlab-run header is refused in one line, and so is a header of a newer format version. A decompression
bomb is refused when a line runs past MAX_LINE bytes (a bomb is mostly one endless line) or the stream
inflates more than MAX_RATIO times its compressed size. A file cut short (a killed run, a partial copy)
plays up to its last whole item, and `cut_short` says so. A line that is JSON but not an item is skipped
and counted (`skipped`, its first reason in `skip_reason`).
"""
from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.record.codec import BadItem, Decoder
from app.record.header import FORMAT, FORMAT_VERSION
from engine.files import UnreadableFile, open_regular

try:
    import zstandard
except ImportError:
    zstandard = None  # type: ignore[assignment]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
MAX_HEADER = 1 * 2**20
MAX_LINE = 64 * 2**20  # one item: a block map of 100k blocks is ~9 MB
MAX_RATIO = 10_000  # decompressed / compressed: an idle run's snapshots compress a few hundred times, zeros 30,000x
RATIO_AFTER = 256 * 2**20  # checked once this much has been inflated
MAX_WINDOW = 2**27  # zstd's window: what a frame may ask the decoder to keep (ours use 2 MiB)
READ_CHUNK = 2**20
MAX_BAD_IN_A_ROW = 100_000  # lines that are no items, one after another: not a recording (a bomb of newlines)
_HEAD = re.compile(rb'\{"t":(-?[0-9][0-9.eE+-]{0,30}),"k":"([A-Za-z]{1,40})"')


class RecordingError(ValueError):
    """Not a recording this version can play: the message is one line naming the file."""

    def __init__(self, path, why: str) -> None:
        super().__init__(f"{path}: {why}")


class _Counted(io.RawIOBase):
    """The compressed file, counting what the decompressor took (for the inflation ratio)."""

    def __init__(self, f) -> None:
        self.f, self.n = f, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.n += n or 0
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


def _open_regular(path: Path):
    """The project's bounded reader's open (engine/files.py): a regular file, opened without blocking."""
    try:
        return open_regular(path, buffering=READ_CHUNK)
    except FileNotFoundError:
        raise RecordingError(path, "no such file") from None
    except UnreadableFile as exc:
        raise RecordingError(path, f"not a recording: {exc.why}") from None


class Recording:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.header: dict = {}
        self.cut_short: str | None = None  # a line saying the file ended early, once read to its end
        self.ended: dict | None = None  # the end line's facts (items, dropped, stopped)
        self.skipped = 0
        self.skip_reason = ""
        self.last_t = 0.0
        self._open()

    def _open(self) -> None:
        raw = _open_regular(self.path)
        magic = raw.peek(4)[:4]
        self._counted = _Counted(raw)
        if magic.startswith(ZSTD_MAGIC):
            if zstandard is None:
                raw.close()
                raise RecordingError(self.path, "zstd-compressed, and the zstandard package is not installed")
            dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
            inner: Any = dctx.stream_reader(self._counted,  # type: ignore[arg-type]
                                            read_size=READ_CHUNK, read_across_frames=True)
        elif magic.startswith(GZIP_MAGIC):
            inner = gzip.GzipFile(fileobj=self._counted, mode="rb")
        else:
            raw.close()
            raise RecordingError(self.path, "not a recording (neither zstd nor gzip: an .inferlab-run file is one)")
        self._stream = io.BufferedReader(inner, buffer_size=READ_CHUNK)
        self._inflated = 0
        try:
            line = self._line(MAX_HEADER)
        except (RecordingError, OSError, EOFError) as exc:
            self.close()
            raise RecordingError(self.path, f"not a recording ({_why(exc)})") from None
        header = _json(line)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            self.close()
            raise RecordingError(self.path, "not a recording (its first line is no inferlab-run header)")
        version = header.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            self.close()
            raise RecordingError(self.path, "not a recording (its header has no format version)")
        if version > FORMAT_VERSION:
            self.close()
            raise RecordingError(self.path, f"recorded by a newer inferlab ({str(header.get('inferlab'))[:20]}, "
                                            f"format {version}); this one plays format {FORMAT_VERSION} at most")
        self.header = header

    def _line(self, limit: int) -> bytes:
        """The next line with its newline; b"" at the end; a last line without one comes back as it is."""
        try:
            line = self._stream.readline(limit + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise EOFError(_why(exc)) from None
        except Exception as exc:
            if zstandard is not None and isinstance(exc, zstandard.ZstdError):
                if "window" in str(exc).lower() or "frame" in str(exc).lower() and "size" in str(exc).lower():
                    raise RecordingError(self.path, f"refused: {exc} (a decompression bomb?)") from None
                raise EOFError(_why(exc)) from None
            raise
        if len(line) > limit:
            raise RecordingError(self.path, f"refused: a line of more than {limit / 2**20:.0f} MiB (a decompression "
                                            "bomb, or not a recording)")
        self._inflated += len(line)
        if self._inflated > RATIO_AFTER and self._inflated > MAX_RATIO * max(self._counted.n, 1):
            raise RecordingError(self.path, f"refused: it inflates more than {MAX_RATIO}x (a decompression bomb)")
        return line

    def lines(self) -> Iterator[tuple[float, str, bytes]]:
        """(seconds, kind, the raw line) for each whole line up to the end line, without decoding the item
        (a seek skips through a file at the speed of decompression). Stops where the file was cut short."""
        n = bad_in_a_row = 0
        while True:
            try:
                line = self._line(MAX_LINE)
            except EOFError as exc:
                self._cut(n, str(exc))
                return
            if not line.endswith(b"\n"):  # the end of the file, mid-line or at a line's end
                self._cut(n, "it ends mid-item" if line else "no end line")
                return
            head = _HEAD.match(line)
            t = _number(head.group(1)) if head is not None else None
            if head is not None and t is not None:
                kind = head.group(2).decode()
            else:  # not as the writer writes it: the whole line parsed
                obj = _json(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
                    bad_in_a_row += 1
                    if bad_in_a_row > MAX_BAD_IN_A_ROW:
                        raise RecordingError(self.path, f"refused: {MAX_BAD_IN_A_ROW:,} lines in a row that are no "
                                                        "items (not a recording, or a decompression bomb)")
                    self._skip("a line that is not an item")
                    continue
                t, kind = obj.get("t"), obj["k"]
                t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t == t else self.last_t
            bad_in_a_row = 0
            if kind == "end":
                obj = _json(line)
                self.ended = obj.get("d") if isinstance(obj, dict) and isinstance(obj.get("d"), dict) else {}
                return
            self.last_t = max(self.last_t, t)
            n += 1
            yield t, kind, line

    def decode(self, line: bytes, decoder: Decoder):
        """The item on a line from lines(); None (counted in `skipped`) where it is not one."""
        obj = _json(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
            self._skip("a line that is not an item")
            return None
        try:
            return decoder.item(obj["k"], obj.get("d"))
        except (BadItem, RecursionError, ValueError, TypeError) as exc:
            self._skip(str(exc) if not isinstance(exc, RecursionError) else "nested too deep")
            return None

    def items(self, decoder: Decoder | None = None) -> Iterator[tuple[float, object]]:
        """(seconds since the start, item) for each whole item, streamed; stops at the end line or where the
        file was cut short (then `cut_short` says so). RecordingError for a bomb found on the way."""
        decoder = decoder or Decoder()
        for t, _kind, line in self.lines():
            item = self.decode(line, decoder)
            if item is not None:
                yield t, item

    def _cut(self, n: int, why: str) -> None:
        self.cut_short = (f"recording cut short ({why}): played up to its last whole item "
                          f"({n:,} items, {self.last_t:.1f} s)")

    def _skip(self, why: str) -> None:
        self.skipped += 1
        self.skip_reason = self.skip_reason or why[:120]

    def close(self) -> None:
        try:
            self._stream.close()
        except Exception:  # noqa: BLE001 (a broken stream closes as far as it can)
            self._counted.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _json(line: bytes):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _number(text: bytes) -> float | None:
    try:
        t = float(text)
    except ValueError:
        return None
    return t if t == t else None


def _why(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:120]


def open_recording(path: str | Path) -> Recording:
    """The recording at `path`, its header read and checked; RecordingError (one line) else."""
    return Recording(path)
