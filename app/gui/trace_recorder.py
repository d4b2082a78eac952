"""TraceRecorder: the recent history of a run (steps and finished requests), for export.

Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev): one "X" (complete) event per engine step
on the "engine" track, and per request one "X" event per phase (queued, prefill, decode) on a track of
its own. Timestamps are microseconds since the first recorded event.
"""
from __future__ import annotations

import csv
import json
from collections import deque
from pathlib import Path

from engine.events import EngineStepEvent, RequestTimeline

STEP_FIELDS = ("step", "t_start_s", "wall_time_ms", "prefill_tokens", "decode_tokens", "verify_tokens", "running",
               "waiting", "preempted", "rejected", "finished", "kv_blocks_used", "kv_blocks_total")
REQUEST_FIELDS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "cached_tokens", "preemptions",
                  "queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "finish_reason")


class TraceRecorder:
    def __init__(self, max_steps: int = 20000, max_requests: int = 5000) -> None:
        self._steps: deque[tuple] = deque(maxlen=max_steps)
        self._requests: deque[RequestTimeline] = deque(maxlen=max_requests)
        self._t0: float | None = None

    def add(self, event: EngineStepEvent) -> None:
        s = event.stats
        if self._t0 is None:
            self._t0 = min([s.t_start, *(t for _r, t, _n in event.arrived)])
        self._steps.append((s.step, s.t_start, s.wall_time_s, s.num_prefill_tokens, s.num_decode_tokens,
                            s.num_verify_tokens, s.num_running, s.num_waiting, s.num_preempted, s.num_rejected,
                            s.num_finished, s.kv_blocks_used, s.kv_blocks_total))
        self._requests.extend(event.finished)

    def clear(self) -> None:
        self._steps.clear()
        self._requests.clear()
        self._t0 = None

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    # --- Chrome trace ---------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        t0 = self._t0 or 0.0
        us = lambda t: round((t - t0) * 1e6, 1)  # noqa: E731
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "inferlab engine"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "engine steps"}},
            {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "requests"}},
        ]
        for (step, t, wall, pre, dec, ver, run, wait, preempt, rej, fin, used, total) in self._steps:
            kind = "prefill+decode" if pre and dec else ("prefill" if pre else "decode")
            events.append({"name": f"step {step} ({kind})", "cat": "step", "ph": "X", "ts": us(t),
                           "dur": round(wall * 1e6, 1), "pid": 1, "tid": 0,
                           "args": {"prefill_tokens": pre, "decode_tokens": dec, "verify_tokens": ver,
                                    "running": run, "waiting": wait, "preempted": preempt, "rejected": rej,
                                    "finished": fin, "kv_blocks_used": used, "kv_blocks_total": total}})
        for i, r in enumerate(self._requests, start=1):
            events.append({"name": "thread_name", "ph": "M", "pid": 2, "tid": i, "args": {"name": r.request_id}})
            phases = (("queued", r.arrival, r.first_scheduled), ("prefill", r.first_scheduled, r.first_token),
                      ("decode", r.first_token, r.finished))
            for name, a, b in phases:
                if a is not None and b is not None and b >= a:
                    events.append({"name": name, "cat": "request", "ph": "X", "ts": us(a),
                                   "dur": round((b - a) * 1e6, 1), "pid": 2, "tid": i,
                                   "args": {"request_id": r.request_id, "prompt_tokens": r.num_prompt_tokens,
                                            "output_tokens": r.num_output_tokens,
                                            "finish_reason": r.finish_reason}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"source": "inferlab", "steps": len(self._steps), "requests": len(self._requests)}}

    def write_chrome_trace(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.chrome_trace()), encoding="utf-8")

    # --- CSV ----------------------------------------------------------------------------------------
    def write_steps_csv(self, path: str | Path) -> None:
        t0 = self._t0 or 0.0
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(STEP_FIELDS)
            for row in self._steps:
                w.writerow((row[0], f"{row[1] - t0:.6f}", f"{row[2] * 1e3:.3f}", *row[3:]))

    def write_requests_csv(self, path: str | Path) -> None:
        t0 = self._t0 or 0.0
        ms = lambda v: "" if v is None else f"{v * 1e3:.3f}"  # noqa: E731
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(REQUEST_FIELDS)
            for r in self._requests:
                w.writerow((r.request_id, f"{r.arrival - t0:.6f}", r.num_prompt_tokens, r.num_output_tokens,
                            r.num_cached_tokens, r.num_preemptions, ms(r.queue_time), ms(r.ttft), ms(r.tpot),
                            ms(r.e2e), r.finish_reason or ""))
