"""Batch sizes from this machine's roofline knee (`values_unit = "knee"` in a [compare] section).

A decode step reads every weight once and does one multiply-add per weight per request in the batch: at
batch B its arithmetic intensity is about 2 B FLOPs per weight, i.e. 2 B / (bytes per weight) FLOPs per
byte. Below the ridge of the roofline (peak FLOP/s / bandwidth, both measured by engine/perf/probe.py) a
step is bound by reading the weights, so another request in the batch costs almost nothing: each user's
speed barely moves while the total grows. Past it the arithmetic binds and each user's speed falls. So the
knee batch is ridge x bytes per weight / 2, and a chapter about batch size sweeps multiples of it: on a CPU
whose knee is at 6, batch 1 to 8 shows almost nothing of the tradeoff; on a GPU whose knee is at 300,
batch 32 shows nothing at all.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
MAX_KNEE_BATCH = 256  # a GPU's knee can be in the hundreds; the sweep's largest batch stays a workload's size


@dataclass(frozen=True, slots=True)
class Knee:
    batch: int  # the decode batch where a step turns from memory- to compute-bound (rounded, at least 2)
    ridge_flops_per_byte: float
    peak_flops: float
    bandwidth_bytes_per_s: float
    bytes_per_weight: float
    roofs_how: str

    def as_dict(self) -> dict:
        return asdict(self)

    def batch_for(self, multiple: float) -> int:
        return max(1, min(MAX_KNEE_BATCH * 4, round(multiple * self.batch)))

    def regime(self) -> str:
        """The chapter's regime on this machine, in words for the screen."""
        return (f"batch is nearly free up to ~{self.batch} here: below it a decode step waits on reading the "
                f"weights ({self.bandwidth_bytes_per_s / 1e9:.1f} GB/s), above it on arithmetic "
                f"({self.peak_flops / 1e9:.0f} GFLOP/s): the roofline's knee, {self.ridge_flops_per_byte:.1f} "
                f"FLOPs per byte, measured")


def knee_from_roofs(roofs, dtype: str) -> Knee:
    """The knee for weights of `dtype` ("bfloat16", "float32", ...) under the measured `roofs`."""
    per_weight = BYTES_PER_WEIGHT.get(dtype, 2.0)
    peak = roofs.flops_roof(dtype if dtype in roofs.peak_flops else "bfloat16")
    ridge = peak / roofs.bandwidth_bytes_per_s
    batch = max(2, min(MAX_KNEE_BATCH, round(ridge * per_weight / 2)))
    return Knee(batch, ridge, peak, roofs.bandwidth_bytes_per_s, per_weight, roofs.how)


def measure_knee(device, dtype: str) -> Knee:
    """The knee on `device` (the roofs cached per machine and thread count, probed once: ~20 s)."""
    from engine.perf.probe import probe_roofs

    return knee_from_roofs(probe_roofs(device), dtype)


def knee_label(batch: int, multiple: float) -> str:
    if batch == 1:
        return "batch 1"
    if multiple == 1:
        return f"batch {batch} (the knee)"
    return f"batch {batch} ({multiple:g}x the knee)"
