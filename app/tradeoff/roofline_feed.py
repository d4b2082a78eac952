"""RooflineFeed: step stats -> roofline dots and verdict lines (the decision lives here, not in the view).

The verdict line per kind of step summarises the last VERDICT_WINDOW steps of that kind: the most
common verdict, and the median fraction of the roof that bounds them, e.g.
"decode: memory-bound, 71 % of measured bandwidth".
"""
from __future__ import annotations

from collections import Counter, deque

from engine.events import StepStats
from engine.perf.roofline import Roofs, StepVerdict, step_verdict

VERDICT_WINDOW = 50


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
        """The engine thread's ("roofline", …) event: the roofs, and the sweep stored for this machine
        and model (shown on the tradeoff plot until a new sweep replaces it)."""
        if payload.get("roofs") is not None:
            self.set_roofs(payload["roofs"])
        if payload.get("stored"):
            tradeoff_panel.set_sweep(payload["stored"])


def roofline_at_load(engine) -> dict:
    """In the engine thread, once the model is loaded: the probed roofs (measured at the first start on
    this machine, a few seconds; cached afterwards) and the stored sweep. Never raises."""
    from app.tradeoff import sweep_store
    from engine.perf.probe import probe_roofs

    try:
        roofs = probe_roofs(engine.device)
    except Exception as exc:  # the panel then says it has no roofs; the engine serves on
        return {"roofs": None, "stored": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"roofs": roofs, "stored": sweep_store.load(roofs.machine, engine.model_path)}
