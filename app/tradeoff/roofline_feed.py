"""RooflineFeed: step stats -> roofline dots and verdict lines (the decision lives here, not in the view);
RoofProbe: the machine's roofs, measured off the engine thread after the first tokens.

The verdict line per kind of step summarises the last VERDICT_WINDOW steps of that kind: the most
common verdict, and the median fraction of the roof that bounds them, e.g.
"decode: memory-bound, 71 % of measured bandwidth".
"""
from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable

from app.source import channel
from engine.events import EngineStepEvent, StepStats
from engine.perf.roofline import Roofs, StepVerdict, step_verdict
from engine.serving.loop import Subscriber

VERDICT_WINDOW = 50
FIRST_TOKENS_WAIT_S = 15.0  # the probe starts after the first tokens, or after this long without any
PROBE_WAITING = "Roofs: probing this machine after the first tokens…"
PROBE_RUNNING = "Roofs: probing this machine… (at most {:.0f} s, beside the engine)"


def step_kind(stats: StepStats) -> str:
    if stats.num_prefill_tokens:
        return "prefill"
    return "verify" if stats.num_verify_tokens else "decode"


def summary_line(kind: str, verdicts: list[StepVerdict]) -> str:
    bound = Counter(v.bound for v in verdicts).most_common(1)[0][0]
    same = sorted(v.fraction for v in verdicts if v.bound == bound)
    median = same[len(same) // 2]
    n = f" (last {len(verdicts)} steps)"
    if bound == "overhead-bound":
        return f"{kind}: overhead-bound, {1 / max(median, 1e-9):.1f}x the roofs' prediction{n}"
    what = "peak FLOP/s" if bound == "compute-bound" else "bandwidth"
    return f"{kind}: {bound}, {100 * median:.0f} % of measured {what}{n}"


class RooflineFeed:
    def __init__(self, panel) -> None:
        self.panel = panel
        self.roofs: Roofs | None = None
        self._recent: dict[str, deque] = {}

    def set_roofs(self, roofs: Roofs) -> None:
        self.roofs = roofs
        self.panel.set_roofs(roofs.peak_flops, roofs.bandwidth_bytes_per_s, roofs.how, roofs.machine)

    def add(self, stats: StepStats) -> None:
        if self.roofs is None or not stats.flops:
            return
        verdict = step_verdict(self.roofs, stats.flops, stats.bytes_moved, stats.wall_time_s)
        if verdict is None:
            return
        kind = step_kind(stats)
        self.panel.add_step(kind, verdict.intensity, verdict.achieved_flops)
        recent = self._recent.setdefault(kind, deque(maxlen=VERDICT_WINDOW))
        recent.append(verdict)
        if len(recent) == 1 or stats.step % 10 == 0:  # the text changes slowly: refresh it now and then
            self.panel.set_verdict(kind, summary_line(kind, list(recent)))

    def clear(self) -> None:
        self._recent.clear()
        self.panel.reset()

    def on_loaded(self, payload: dict, tradeoff_panel) -> None:
        """A RoofProbe's RooflineAtLoad: the roofs when known (else what the probe is doing), and the
        sweep stored for this machine and model (shown on the tradeoff plot until a new sweep replaces it)."""
        if payload.get("roofs") is not None:
            self.set_roofs(payload["roofs"])
        elif payload.get("status"):
            self.panel.set_status(payload["status"])
        if payload.get("stored"):
            tradeoff_panel.set_sweep(payload["stored"])


class RoofProbe(Subscriber):
    """The machine's roofs for the roofline panel, never in the engine's way: a subscriber of the engine
    loop that, for each engine, publishes the cached roofs (and the sweep stored for this machine and
    model) at once, or, when this machine has none yet, says "probing…" and measures them in a thread
    of its own once the first tokens are out (or FIRST_TOKENS_WAIT_S passed), within the probe's time
    limit. On a CPU that emulates bf16 the old probe, in the engine thread, held every panel empty for
    ~6 minutes (issue 24). `publish` takes a typed channel item (app/source/channel.py) from any thread."""

    def __init__(self, publish: Callable[[object], None]) -> None:
        self.publish = publish
        self.first_tokens = threading.Event()
        self.thread: threading.Thread | None = None

    def on_engine(self, engine) -> None:
        from app.tradeoff import sweep_store
        from engine.perf.probe import cached_roofs, machine_name

        stored = sweep_store.load(machine_name(engine.device), engine.model_path)
        roofs = cached_roofs(engine.device)
        if roofs is not None or (self.thread is not None and self.thread.is_alive()):
            self.publish(channel.RooflineAtLoad({"roofs": roofs, "stored": stored}))
            return
        self.first_tokens.clear()
        self.publish(channel.RooflineAtLoad({"roofs": None, "stored": stored, "status": PROBE_WAITING}))
        threads = getattr(getattr(engine, "threads", None), "count", None)
        self.thread = threading.Thread(target=self._probe, args=(engine.device, threads), daemon=True,
                                       name="inferlab-roof-probe")
        self.thread.start()

    def on_step(self, event: EngineStepEvent) -> None:
        # inside engine.step(): one flag test once the first tokens are out
        if not self.first_tokens.is_set() and any(o.new_token_ids for o in event.outputs):
            self.first_tokens.set()

    def _probe(self, device, threads: int | None) -> None:
        import torch

        from engine.perf.probe import PROBE_TIME_LIMIT_S, probe_roofs

        self.first_tokens.wait(FIRST_TOKENS_WAIT_S)
        self.publish(channel.RooflineAtLoad({"roofs": None, "status": PROBE_RUNNING.format(PROBE_TIME_LIMIT_S)}))
        if threads:  # a new thread starts with torch's default count: measure with the engine's
            torch.set_num_threads(threads)
        try:
            roofs = probe_roofs(device)
        except Exception as exc:  # noqa: BLE001 (the panel says so; the engine serves on)
            self.publish(channel.RooflineAtLoad({"roofs": None, "status": f"no roofs: {type(exc).__name__}: {exc}"}))
            return
        self.publish(channel.RooflineAtLoad({"roofs": roofs}))
