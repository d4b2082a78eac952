"""How long a step carrying prompt tokens takes on this machine, learnt from the steps the engine ran.

A step that carries a prompt chunk runs every row through the layers: its time grows with its rows,
t ≈ a + b · rows, with `a` the fixed cost of one layer-by-layer pass (weights read, ~360 small ops) and
`b` the cost of one more row. The scheduler asks the inverse question (SchedulerConfig.max_step_ms):
how many prompt tokens fit beside this step's decodes so that it stays within a time? While requests
are decoding, every step's length is their time per output token (TPOT): a 512-token chunk takes about
half a second on a 2-core CPU, so every stream in the batch would wait half a second for its next token
(Sarathi-Serve's "stall-free batching" sizes chunks the same way, from a profiled cost per token).

The fit is a least-squares line over recent steps, each weighted by how recent it is (a machine that
gets busier, or a new weight format, moves it within a few dozen steps). Until it has seen two
different step sizes it has no slope, and the scheduler keeps its token budget alone. The scheduler keeps
a second model for steps of decodes alone (they run on another path, the fused decode step): what a plain
decode step costs is what the TPOT budget saves by running one (engine/core/scheduler.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DECAY = 0.95  # weight of an observation per newer one: about the last 20-40 steps count
MIN_CHUNK_TOKENS = 32  # a prompt always advances at least this much per step (never starved to 0)


@dataclass(slots=True)
class StepTimeModel:
    """t = intercept + slope · rows, fitted on the steps that carried prompt tokens."""

    sw: float = 0.0  # decayed sums: weights, x, y, x², x·y
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    min_chunk: int = MIN_CHUNK_TOKENS

    def observe(self, rows: int, seconds: float) -> None:
        """One step that ran `rows` rows (prompt tokens + decode rows) in `seconds`."""
        if rows <= 0 or not (seconds > 0 and math.isfinite(seconds)):  # a clock that lies teaches nothing
            return
        self.sw, self.sx, self.sy = DECAY * self.sw + 1, DECAY * self.sx + rows, DECAY * self.sy + seconds
        self.sxx, self.sxy = DECAY * self.sxx + rows * rows, DECAY * self.sxy + rows * seconds

    def line(self) -> tuple[float, float] | None:
        """(intercept s, slope s per row), or None before two different step sizes were seen."""
        det = self.sw * self.sxx - self.sx * self.sx
        if self.sw < 2 or det <= 1e-9 * self.sw * self.sxx:
            return None
        slope = (self.sw * self.sxy - self.sx * self.sy) / det
        if not slope > 0:  # noise (a busy machine) can tilt it: the mean cost per row, no fixed part
            return 0.0, self.sy / self.sx
        return max(0.0, (self.sy - slope * self.sx) / self.sw), slope

    def predict(self, rows: int) -> float | None:
        """Seconds for a step of `rows` rows: the line, the mean step while it has one size only, None unseen."""
        fit = self.line()
        if fit is not None:
            return fit[0] + fit[1] * rows
        return self.sy / self.sw if self.sw > 0 else None

    def prompt_tokens_within(self, seconds: float, decode_rows: int, budget: int, min_chunk: int | None = None) -> int:
        """Prompt tokens a step with `decode_rows` decodes may carry to stay within `seconds` (at least
        `min_chunk`, by default the model's, at most `budget`); `budget` itself while the model has no line yet."""
        fit = self.line()
        if fit is None:
            return budget
        intercept, slope = fit
        fits = int((seconds - intercept) / slope) - decode_rows
        return min(budget, max(self.min_chunk if min_chunk is None else min_chunk, fits))
