"""Pareto frontiers of sweep points (pure). A point is on the frontier when no other point is at least
as good on every objective and better on one."""
from __future__ import annotations

from collections.abc import Callable, Sequence

Objective = Callable[[dict], float]  # larger is better


def pareto(points: Sequence[dict], objectives: Sequence[Objective]) -> list[int]:
    """Indices of the non-dominated points, in input order."""
    values = [[f(p) for f in objectives] for p in points]
    keep = []
    for i, vi in enumerate(values):
        dominated = any(all(a >= b for a, b in zip(vj, vi)) and any(a > b for a, b in zip(vj, vi))
                        for j, vj in enumerate(values) if j != i)
        if not dominated:
            keep.append(i)
    return keep


def speed(p: dict) -> float:
    return p["tokens_per_s_user"] or 0.0


def cheapness(p: dict) -> float:
    return -(p["usd_per_mtok"] if p["usd_per_mtok"] is not None else float("inf"))


def fidelity(p: dict) -> float:
    """Quality kept: -KL vs the 16-bit model (0 at 16 bits); a point without quality counts as worst."""
    return -(p["kl"] if p.get("kl") is not None else float("inf"))


def frontiers(points: Sequence[dict]) -> tuple[list[int], list[int]]:
    """(speed vs cost, speed vs cost vs quality) frontier indices among measured points with a cost."""
    usable = [i for i, p in enumerate(points) if p["usd_per_mtok"] is not None and not p.get("predicted")]
    sub = [points[i] for i in usable]
    two = [usable[i] for i in pareto(sub, (speed, cheapness))]
    three = [usable[i] for i in pareto(sub, (speed, cheapness, fidelity))]
    return two, three
