"""`inferlab bench gui --json OUT`: does watching slow the engine down?

One engine, one fixed workload (the same seeded requests each time, all submitted at once), measured
three ways in one run, interleaved so that drift in the machine's speed hits all of them alike:
  bare      drive(engine): the engine stepped in the main thread (how benchmarks run it)
  host      the app's engine thread (EngineHost) with its event listener, nobody watching
  gui       the same, with the main window open and every panel fed and repainting
tokens/s = generated tokens / (last step end - first step start). The GUI run also records the event
loop's delay with a 10 ms QTimer probe.

The bare runs and the engine's construction run in worker threads too, never in the main thread, as in
the app (whose GUI thread never runs torch): torch's OpenMP (libgomp) keeps one thread pool per thread
that used it, and once the pools hold more threads than there are cores it stops spin-waiting between
parallel regions, so a step in a second thread ran ~25 % slower than in the first (measured on 2 cores:
bare 14.4 s vs host 19.2 s for the same 103 steps when the main thread had run torch first).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from app.device_args import device_options
from app.load.generator import LoadConfig, LoadGenerator
from engine.runner.threads import off_main_thread

PROBE_MS = 10


def add_args(p, engine_args) -> None:
    engine_args(p)
    p.add_argument("--json", metavar="OUT", help="write the results here")
    p.add_argument("--requests", type=int, default=24, help="requests in the fixed workload")
    p.add_argument("--prompt-tokens", type=int, nargs=2, default=(64, 256), metavar=("LO", "HI"))
    p.add_argument("--output-tokens", type=int, default=96, help="max_tokens of every request (EOS ignored)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of bare / host / gui (medians compared)")


class _Counter:
    """An engine listener: generated tokens, finished requests, first step start, last step end."""

    def __init__(self) -> None:
        self.tokens = self.finished = 0
        self.t_first: float | None = None
        self.t_last = 0.0

    def __call__(self, event) -> None:
        s = event.stats
        self.t_first = s.t_start if self.t_first is None else self.t_first
        self.t_last = s.t_start + s.wall_time_s
        self.tokens += sum(len(o.new_token_ids) for o in event.outputs)
        self.finished += len(event.finished)

    def result(self, mode: str) -> dict:
        seconds = self.t_last - (self.t_first or self.t_last)
        return {"mode": mode, "generated_tokens": self.tokens, "seconds": round(seconds, 3),
                "tokens_per_s": round(self.tokens / seconds, 2) if seconds > 0 else None}


def _workload(engine, args) -> list:
    cfg = LoadConfig(prompt_tokens=tuple(args.prompt_tokens), output_tokens=(args.output_tokens,) * 2,
                     temperature=0.8, ignore_eos=True)
    gen = LoadGenerator(cfg, engine.tokenizer, rng_seed=7, max_model_len=engine.max_model_len)
    return [gen.make_arrival() for _ in range(args.requests)]


def _run_bare(engine, arrivals) -> dict:
    import torch

    from engine.drive import drive
    from engine.sampling_params import SamplingParams

    if engine.config.num_threads:
        torch.set_num_threads(engine.config.num_threads)  # per OS thread
    counter = _Counter()
    engine.add_listener(counter)
    try:
        for a in arrivals:
            engine.add_request(a.prompt_token_ids, SamplingParams(**a.sampling))
        drive(engine)
    finally:
        engine.remove_listener(counter)
    return counter.result("bare")


def _run_hosted(engine, arrivals, app, with_window: bool) -> dict:
    from PySide6.QtCore import QEventLoop, QTimer

    from app.host.engine_host import EngineHost

    counter = _Counter()
    engine.add_listener(counter)
    host = EngineHost(engine.config, engine=engine)
    window, stamps = None, []
    if with_window:
        from app.gui.main_window import MainWindow

        window = MainWindow(host, None, persist=False)
        window.controller.interactive = False
        window.resize(1600, 1000)
        window.show()
    host.start()
    loop = QEventLoop()
    probe = QTimer()
    probe.setInterval(PROBE_MS)
    probe.timeout.connect(lambda: stamps.append(time.perf_counter()))
    poll = QTimer()
    poll.setInterval(20)
    state = {"submitted": False}

    def check() -> None:
        ready = host.loaded and (window is None or window.controller.engine_ready)
        if ready and not state["submitted"]:
            state["submitted"] = True
            host.submit_batch(arrivals)
            probe.start()
        if state["submitted"] and counter.finished >= len(arrivals):
            loop.quit()

    poll.timeout.connect(check)
    poll.start()
    loop.exec()
    probe.stop()
    poll.stop()
    rate_hz = window.governor.rate_hz if window is not None else None
    if window is not None:
        window.close()
        window.deleteLater()
    else:
        host.shutdown()
    engine.remove_listener(counter)
    out = counter.result("gui" if with_window else "host")
    if rate_hz is not None:
        out["panel_repaint_hz"] = round(rate_hz, 1)  # where the frame governor settled
    if with_window and len(stamps) > 2:
        delays = np.diff(stamps) * 1e3 - PROBE_MS
        out["event_loop_delay_ms"] = {"p50": round(float(np.percentile(delays, 50)), 1),
                                      "p99": round(float(np.percentile(delays, 99)), 1),
                                      "max": round(float(delays.max()), 1)}
    return out


def run(args) -> dict:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.device_args import engine_threads
    from app.generate import stderr_progress
    from app.gui.launch import prepare_qt_environment

    prepare_qt_environment()
    from engine import EngineConfig, LLMEngine

    app = QApplication.instance() or QApplication([])
    # no prefix caching: every run must do the same work, not reuse the previous run's prompts
    threads = args.threads or engine_threads()  # the app's default unless --threads says otherwise
    config = EngineConfig(model=args.model, dtype=args.dtype, **device_options(args), num_threads=threads,
                          enable_prefix_caching=False)
    engine = off_main_thread(lambda: LLMEngine(config, progress=stderr_progress))
    arrivals = _workload(engine, args)
    off_main_thread(_run_bare, engine, arrivals[:4])  # warm-up
    runs = []
    for _ in range(args.repeats):
        runs.append(off_main_thread(_run_bare, engine, arrivals))
        runs.append(_run_hosted(engine, arrivals, app, with_window=False))
        runs.append(_run_hosted(engine, arrivals, app, with_window=True))
    # medians over the rounds: one slow minute of this shared machine does not decide the ratio
    med = {m: statistics.median(r["tokens_per_s"] for r in runs if r["mode"] == m) for m in ("bare", "host", "gui")}
    return {
        "workload": {"requests": len(arrivals), "prompt_tokens": sum(len(a.prompt_token_ids) for a in arrivals),
                     "output_tokens": sum(a.sampling["max_tokens"] for a in arrivals),
                     "max_num_seqs": engine.config.max_num_seqs},
        "qt_platform": app.platformName(), "engine_threads": threads,
        "runs": runs, "tokens_per_s_median": {m: round(v, 2) for m, v in med.items()},
        "ratio_gui_vs_bare": round(med["gui"] / med["bare"], 3),
        "ratio_gui_vs_host": round(med["gui"] / med["host"], 3),
        "ratio_host_vs_bare": round(med["host"] / med["bare"], 3),
    }
