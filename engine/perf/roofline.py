"""The roofline of a measured machine, and the verdict on one step (pure: no torch).

A step that moved B bytes and did F FLOPs cannot take less than max(F / peak FLOP/s, B / bandwidth).
Whichever term is larger names the roof it runs under; a step whose wall time is far above both
(OVERHEAD_FACTOR times the larger) is spending its time on neither: Python, launches, synchronisation.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

OVERHEAD_FACTOR = 3.0  # wall time above this many times the roof's prediction: overhead-bound


@dataclass(frozen=True, slots=True)
class Roofs:
    """The machine's measured roofs and how they were measured."""

    machine: str  # CPU model or GPU name
    threads: int
    torch_version: str
    peak_flops: dict[str, float]  # dtype name -> FLOP/s (median of the GEMM runs)
    bandwidth_bytes_per_s: float  # memory read bandwidth (median of the streaming runs)
    how: str  # sizes, repeats, median: shown next to the roofs
    measured_at: str  # UTC, ISO 8601

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Roofs:
        """From a stored dict; ValueError where a roof is not a positive finite number (a damaged or edited
        cache would otherwise divide by zero, or show a figure nobody measured)."""
        roofs = cls(machine=str(d["machine"]), threads=int(d["threads"]), torch_version=str(d["torch_version"]),
                    peak_flops={str(k): float(v) for k, v in d["peak_flops"].items()},
                    bandwidth_bytes_per_s=float(d["bandwidth_bytes_per_s"]), how=str(d["how"]),
                    measured_at=str(d["measured_at"]))
        figures = [roofs.bandwidth_bytes_per_s, *roofs.peak_flops.values()]
        if not roofs.peak_flops or roofs.threads < 1 or not all(math.isfinite(v) and v > 0 for v in figures):
            raise ValueError(f"roofs out of range: {roofs.peak_flops}, {roofs.bandwidth_bytes_per_s} B/s, "
                             f"{roofs.threads} threads")
        return roofs

    def flops_roof(self, dtype: str = "bfloat16") -> float:
        return self.peak_flops.get(dtype) or max(self.peak_flops.values())

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the two roofs meet (bf16)."""
        return self.flops_roof() / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class StepVerdict:
    bound: str  # "compute-bound" | "memory-bound" | "overhead-bound"
    intensity: float  # FLOPs per byte
    achieved_flops: float  # FLOP/s
    achieved_bandwidth: float  # bytes/s
    fraction: float  # of the roof that bounds it (FLOP/s or bandwidth; for overhead: of the nearer roof)
    roof_time_s: float  # the roofs' prediction for this step

    def describe(self, kind: str) -> str:
        what = "peak FLOP/s" if self.bound == "compute-bound" else "bandwidth"
        if self.bound == "overhead-bound":
            return (f"{kind}: overhead-bound, step {1 / max(self.fraction, 1e-9):.1f}x the roofs' "
                    f"prediction")
        return f"{kind}: {self.bound}, {100 * self.fraction:.0f} % of measured {what}"


def step_verdict(roofs: Roofs, flops: int, bytes_moved: int, wall_time_s: float,
                 dtype: str = "bfloat16") -> StepVerdict | None:
    """None for a step with nothing counted or no time."""
    if wall_time_s <= 0 or (flops <= 0 and bytes_moved <= 0):
        return None
    peak, bw = roofs.flops_roof(dtype), roofs.bandwidth_bytes_per_s
    t_compute, t_memory = flops / peak, bytes_moved / bw
    roof = max(t_compute, t_memory)
    achieved_f, achieved_b = flops / wall_time_s, bytes_moved / wall_time_s
    intensity = flops / bytes_moved if bytes_moved else float("inf")
    if wall_time_s > OVERHEAD_FACTOR * roof:
        return StepVerdict("overhead-bound", intensity, achieved_f, achieved_b, roof / wall_time_s, roof)
    if t_compute >= t_memory:
        return StepVerdict("compute-bound", intensity, achieved_f, achieved_b, achieved_f / peak, roof)
    return StepVerdict("memory-bound", intensity, achieved_f, achieved_b, achieved_b / bw, roof)
