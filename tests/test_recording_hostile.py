"""Hostile recordings: cut short, from a newer version, junk, decompression bombs, and a 1 GB one replayed
in bounded memory (made here, never committed)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest
import zstandard

from app.record.codec import encode
from app.record.header import make_header
from app.record.reader import RecordingError, open_recording
from app.record.writer import RecordingWriter
from app.source import channel
from engine.events import EngineStepEvent, RequestOutput, StepKind, StepStats, TokenSource


def _step(k: int, streams: int = 8) -> EngineStepEvent:
    outs = tuple(RequestOutput(f"r{i}", (100 + (i * k) % 300,), f" w{k % 97}", (), "", False,
                               sources=(TokenSource.DECODED,), ttft_s=0.1 + i / 1000, tokens_per_s=30.0 + k % 7)
                 for i in range(streams))
    stats = StepStats(step=k, t_start=1.0 + k * 0.013, wall_time_s=0.01 + (k % 5) / 1000, num_prefill_tokens=0,
                      num_decode_tokens=streams, num_running=streams, num_waiting=k % 3, num_preempted=0,
                      kv_blocks_used=40 + k % 9, kv_blocks_total=256,
                      scheduled=tuple((f"r{i}", 1, StepKind.DECODE) for i in range(streams)))
    return EngineStepEvent(stats=stats, outputs=outs)


def _write(path, n: int, compression: str, version: int = 1) -> None:
    header = {**make_header("synthetic"), "version": version}
    with RecordingWriter(path, header, compression=compression) as w:
        for k in range(n):
            w.put(_step(k), 1.0 + k * 0.013)


def _lines(header: dict, items: list) -> bytes:
    out = [json.dumps(header)]
    out += [json.dumps({"t": t, "k": type(i).__name__, "d": encode(i)}, separators=(",", ":")) for t, i in items]
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_recording_cut_short_plays_up_to_its_last_whole_item(tmp_path, compression):
    whole = tmp_path / "whole.inferlab-run"
    _write(whole, 3000, compression)
    data = whole.read_bytes()
    with open_recording(whole) as rec:
        n_whole = sum(1 for _ in rec.items())
        assert rec.cut_short is None and rec.ended is not None
    cut = tmp_path / "cut.inferlab-run"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with open_recording(cut) as rec:
        steps = [item.stats.step for _t, item in rec.items()]
        assert rec.cut_short and rec.cut_short.startswith("recording cut short") and "\n" not in rec.cut_short
        assert f"{len(steps):,} items" in rec.cut_short
    assert 0 < len(steps) < n_whole and steps == list(range(len(steps)))  # whole items, in order, none made up


def test_a_killed_run_leaves_a_file_that_plays_up_to_its_last_flush(tmp_path):
    """The writer flushes every second: a process killed mid-run (no end line) still plays."""
    path = tmp_path / "killed.inferlab-run"
    script = textwrap.dedent(f"""
        import os, time
        from app.record.header import make_header
        from app.record.writer import RecordingWriter
        from app.source import channel
        w = RecordingWriter({str(path)!r}, make_header("killed"))
        for k in range(50):
            w.put(channel.Message(f"m{{k}}"))
        time.sleep(2.5)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with open_recording(path) as rec:
        texts = [item.text for _t, item in rec.items()]
    assert texts == [f"m{k}" for k in range(50)] and rec.cut_short and "no end line" in rec.cut_short


def test_a_recording_from_a_newer_version_is_refused_in_one_line(tmp_path):
    path = tmp_path / "new.inferlab-run"
    _write(path, 3, "zstd", version=99)
    with pytest.raises(RecordingError) as err:
        open_recording(path)
    message = str(err.value)
    assert "newer inferlab" in message and "format 99" in message and "\n" not in message


@pytest.mark.parametrize("content, why", [
    (os.urandom(4096), "neither zstd nor gzip"),
    (gzip.compress(b"just some text\nmore\n"), "no inferlab-run header"),
    (zstandard.ZstdCompressor().compress(b'{"format": "inferlab-run"}\n'), "no format version"),
    (gzip.compress(b"x" * 10), "not a recording"),
    (b"", "neither zstd nor gzip"),
    (b"\x28\xb5\x2f\xfd" + os.urandom(64), "not a recording"),
])
def test_junk_is_refused_in_one_line(tmp_path, content, why):
    path = tmp_path / "junk.inferlab-run"
    path.write_bytes(content)
    with pytest.raises(RecordingError) as err:
        with open_recording(path) as rec:
            list(rec.items())
    assert why in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value)


def test_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo.inferlab-run"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "absent.inferlab-run"):
        with pytest.raises(RecordingError):
            open_recording(path)


def _bomb(compress, payload: bytes, frames: int) -> bytes:
    header = json.dumps(make_header("bomb")).encode() + b"\n"
    return compress(header) + compress(payload) * frames  # concatenated frames / members read as one stream


@pytest.mark.parametrize("compress", [zstandard.ZstdCompressor(level=19).compress, gzip.compress],
                         ids=["zstd", "gzip"])
@pytest.mark.parametrize("payload, why", [(b"\0" * 2**20, "a line of more than"),
                                          (b"\n" * 2**20, "lines in a row that are no items")],
                         ids=["one-endless-line", "newlines"])
def test_a_decompression_bomb_is_refused_in_one_line(tmp_path, compress, payload, why):
    path = tmp_path / "bomb.inferlab-run"
    path.write_bytes(_bomb(compress, payload, 160))  # 160 MiB once inflated
    with pytest.raises(RecordingError) as err:
        with open_recording(path) as rec:
            for _ in rec.items():
                pass
    assert why in str(err.value) and "\n" not in str(err.value)


def test_items_that_lie_about_their_fields_are_skipped_and_counted(tmp_path):
    path = tmp_path / "lies.inferlab-run"
    good = channel.Message("fine")
    lying = {**encode(_step(1).stats), "num_running": "many"}  # a whole item, one field a string: panels add it
    lines = [json.dumps(make_header("lies")),
             json.dumps({"t": 0.1, "k": "StepStats", "d": lying}),
             '{"t":0.2,"k":"os.system","d":{}}',  # a class by any other name: never built
             '{"t":0.3,"k":"Message","d":{"text":"fine","extra":1}}',
             '{"t":0.4,"k":"Message","d":' + "[" * 5000 + "]" * 5000 + "}",
             json.dumps({"t": 0.5, "k": "Message", "d": encode(good)}), '{"t":0.6,"k":"end","d":{}}']
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with open_recording(path) as rec:
        items = [item for _t, item in rec.items()]
    assert items == [good] and rec.skipped == 4 and rec.cut_short is None


BIG_SCRIPT = """
import sys, time
from app.record.reader import open_recording
def rss_mb(key="VmRSS"):  # VmHWM: this process's peak (ru_maxrss would carry the parent's over exec)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
rec = open_recording(sys.argv[1])
base = rss_mb()
played = sum(1 for _i, _item in zip(range(2000), rec.items()))  # the first seconds, decoded as a replay does
t0 = time.perf_counter()
n = inflated = 0
for t, kind, line in rec.lines():  # a jump to the end: every line read, none kept
    n += 1
    inflated += len(line)
print(f"{base:.0f} {rss_mb('VmHWM'):.0f} {n} {inflated} "
      f"{rec.last_t:.1f} {time.perf_counter() - t0:.1f} {rec.cut_short is None}")
"""


def test_a_1gb_recording_replays_in_bounded_memory(tmp_path):
    """1 GiB of items once inflated (realistic steps, ~20x compressed: ~60 MB on disk, made here in a second:
    one compressed frame of 4 MiB of steps repeated); the reader streams it, never holding it whole."""
    chunk = _lines(make_header("big"), [])  # the header alone in the first frame
    steps = b"".join(json.dumps({"t": 1.0 + k * 0.013, "k": "EngineStepEvent", "d": encode(_step(k))},
                                separators=(",", ":")).encode() + b"\n" for k in range(3000))
    repeat = 2**30 // len(steps) + 1
    frame = zstandard.ZstdCompressor(level=1).compress(steps)
    path = tmp_path / "big.inferlab-run"
    end = json.dumps({"t": 99.0, "k": "end", "d": {}}).encode() + b"\n"
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor().compress(chunk))
        for _ in range(repeat):
            f.write(frame)
        f.write(zstandard.ZstdCompressor().compress(end))
    out = subprocess.run([sys.executable, "-c", BIG_SCRIPT, str(path)], capture_output=True, text=True,
                         timeout=240, check=True).stdout.split()
    base_mb, peak_mb, n, inflated = float(out[0]), float(out[1]), int(out[2]), int(out[3])
    assert inflated >= 2**30 - 2000 * len(steps) // 3000 - len(steps)
    assert n == repeat * 3000 - 2000 and out[6] == "True"
    assert peak_mb < base_mb + 100, f"peak RSS {peak_mb:.0f} MB over a {base_mb:.0f} MB start"
