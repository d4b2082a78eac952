"""A preset left running: does it keep up with its own arrivals, or does its queue grow?

`inferlab --screenshot OUT.png --preset NAME --run-seconds N --report OUT.json` samples what the live
panels show every few seconds while the preset runs (its cues included: bursts, knob changes), and
writes the samples and a verdict: a preset whose waiting queue keeps growing opens a meltdown on stage,
which only the presets about overload may do (scripts/soak_presets.py runs every preset this way).
"""
from __future__ import annotations

import asyncio
import statistics
import time

SAMPLE_EVERY_S = 5.0
GROWING_BY = 2.0  # waiting requests more, on average, in the last quarter than in the second quarter
GROWN_TO = 4  # ... and at least this many waiting at the end: a queue that grows without bound


def sample(window) -> dict:
    """What the room sees now: the queue (timeline), latency and goodput (latency panel)."""
    window.flush_panels()
    timeline = window.panels.timeline.snapshot_data()
    latency = window.panels.latency.snapshot_data()
    last = timeline.get("last") or {}
    within, n = latency.get("num_within_budget"), latency.get("num_in_window")
    return {"waiting": last.get("waiting"), "running": last.get("running"), "step_ms": timeline.get("step_ms"),
            "finished_in_window": n, "goodput_share": (within / n) if n else None,
            "total_tokens_per_s": latency.get("total_tokens_per_s"),
            "p99_ttft_s": (latency.get("percentiles", {}).get("ttft") or {}).get(99)}


async def sample_run(window, seconds: float, every_s: float = SAMPLE_EVERY_S) -> list[dict]:
    samples, t0 = [], time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        await asyncio.sleep(min(every_s, seconds - elapsed))
        samples.append({"t_s": round(time.perf_counter() - t0, 1), **sample(window)})
    return samples


def verdict(samples: list[dict]) -> dict:
    """'keeps up' or 'queue grows', from the waiting queue's course over the run (quarters of the samples)."""
    waiting = [s["waiting"] for s in samples if s.get("waiting") is not None]
    if len(waiting) < 4:
        return {"verdict": "too short to tell", "samples": len(waiting)}
    q = len(waiting) // 4
    second, last = statistics.fmean(waiting[q:2 * q]), statistics.fmean(waiting[-q:])
    grows = last >= second + GROWING_BY and waiting[-1] >= GROWN_TO
    shares = [s["goodput_share"] for s in samples if s.get("goodput_share") is not None]
    return {"verdict": "queue grows" if grows else "keeps up", "mean_waiting_second_quarter": round(second, 2),
            "mean_waiting_last_quarter": round(last, 2), "waiting_at_end": waiting[-1],
            "max_waiting": max(waiting), "goodput_share_at_end": shares[-1] if shares else None,
            "min_goodput_share": min(shares) if shares else None}
