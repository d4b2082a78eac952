"""Which tier's bodies run, chosen by measuring them on this CPU, per kernel family (issue 47).

A CPU's features say which tiers it *can* run, not which is fastest: a Zen 4 runs AVX-512 as two 256-bit
halves, and bf16 dot products cost differently by vendor (the tier picked by features ran the bf16 decode
~1.7x slower than the AVX2 one there). So at the first build every tier this CPU runs is built and its hot
kernels are timed (the bf16 family in both of its walks of the weights, "tiles" and "rows", which give the
same numbers: core/linear.h): the bf16 rows, the 4-bit rows and the 8-bit rows (one row of x against ~64 MiB of weights,
from memory, as a decode step reads them; int8 activations, the engine's default) and the paged decode
attention, a few rounds each, alternating between tiers, median per tier. The fastest tier of each family
is kept in a file beside the builds, named after them: it lives as long as they do (a new source or compiler
flag is a new build name, so a new file, measured again), and a file that lies (names a tier this CPU does
not run, does not match the builds, or whose pick is not its own fastest time) is ignored and measured anew.
INFERLAB_CPU_TIER still forces one tier for everything.

The engine runs one build per family it uses: its weights' family (bf16, 4-bit or 8-bit) for the
weight-streaming products and the fused step, the attention family for the layer path's attention.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.kernels.cpu_times import other_busy_cores, read_cpu_times

FAMILIES = ("bf16", "int4", "int8", "attention")
MARGIN = 0.05  # a candidate replaces the default (the best tier the CPU supports, tiles) only this much faster
BUSY_LIMIT = 0.5  # cores other processes kept busy while timing, past which the choice is not stored
BODIES = {"bf16": ("tiles", "rows")}  # families timed in several walks of the weights, within each tier
VERSION = 2
ROUNDS = 7  # sweeps per tier and family, alternating tiers (the fastest is kept: interference only adds time)
MAX_FILE_BYTES = 64 * 1024
_SWEEP_BYTES = 64 * 2**20  # weights a sweep reads: twice a 32 MiB L3, so they come from memory


def family_for_bits(bits: int) -> str:
    """The kernel family of weights stored at `bits` (EngineConfig.quant_bits)."""
    return {4: "int4", 8: "int8"}.get(int(bits), "bf16")


def candidates(family: str, tiers) -> list[str]:
    """What is timed for `family`: each tier, or "tier/body" for each of its bodies (BODIES)."""
    return [f"{t}/{b}" if b else t for t in tiers for b in BODIES.get(family, ("",))]


def _valid_candidate(family: str, name: object, tiers) -> bool:
    return isinstance(name, str) and name in candidates(family, tiers)


@dataclass(frozen=True)
class TierChoice:
    picks: dict[str, str]  # family -> the fastest candidate ("avx512", or "avx512/rows" for the bf16 family)
    seconds: dict[str, dict[str, float]]  # family -> candidate -> median seconds of one sweep
    builds: list[str] = field(default_factory=list)  # the build names measured (the file's key)
    measured: str = ""  # when, in words

    busy_cores: float = 0.0  # other processes' CPU time while timing, in cores (the thread governor's measure)

    @property
    def tiers(self) -> dict[str, str]:
        """family -> the tier its pick runs in."""
        return {f: c.split("/")[0] for f, c in self.picks.items()}

    def body(self, family: str) -> str | None:
        """The pick's walk of the weights ("tiles", "rows") where the family has several, else None."""
        return self.picks[family].partition("/")[2] or None

    def ratios(self, family: str) -> dict[str, float]:
        """Each candidate's time over the chosen one's (1.0 for the chosen)."""
        best = self.seconds[family][self.picks[family]]
        return {t: round(s / best, 2) for t, s in sorted(self.seconds[family].items())}

    def describe(self) -> str:
        """"bf16 avx512/rows (avx2/tiles 1.31x its time, ...); int4 avx512 (...); ...": the choice and what lost
        by how much."""
        parts = []
        for fam in FAMILIES:
            others = ", ".join(f"{t} {r:.2f}x" for t, r in self.ratios(fam).items() if t != self.picks[fam])
            parts.append(f"{fam} {self.picks[fam]}" + (f" ({others} its time)" if others else ""))
        return "; ".join(parts)

    def as_json(self) -> dict:
        return {"version": VERSION, "picks": self.picks, "seconds": self.seconds, "builds": self.builds,
                "measured": self.measured, "busy_cores": round(self.busy_cores, 2)}


def parse_choice(data: object, builds: list[str], tiers: tuple[str, ...]) -> TierChoice | None:
    """The choice a file holds, None where it lies: another version or other builds, a family missing, a
    tier this CPU does not run, a time that is not a positive finite number, or a pick that is not the
    fastest of its own times."""
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("builds") != builds:
        return None
    picks, seconds = data.get("picks"), data.get("seconds")
    if not isinstance(picks, dict) or not isinstance(seconds, dict):
        return None
    clean: dict[str, dict[str, float]] = {}
    for fam in FAMILIES:
        times = seconds.get(fam)
        if (not isinstance(times, dict) or not times or not _valid_candidate(fam, picks.get(fam), tiers)
                or not all(_valid_candidate(fam, c, tiers) for c in times)):
            return None
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                   for v in times.values()):
            return None
        if picks[fam] not in times or times[picks[fam]] > min(times.values()) * (1 + MARGIN):
            return None  # not (within the margin) the fastest of its own times
        clean[fam] = {t: float(v) for t, v in times.items()}
    measured = data.get("measured")
    when = measured if isinstance(measured, str) else ""
    busy = data.get("busy_cores")
    busy = float(busy) if isinstance(busy, (int, float)) and not isinstance(busy, bool) and math.isfinite(busy) else 0.0
    return TierChoice({f: picks[f] for f in FAMILIES}, clean, list(builds), when, busy)


def read_choice(path: Path, builds: list[str], tiers: tuple[str, ...]) -> TierChoice | None:
    """The choice stored at `path` (a regular file of at most MAX_FILE_BYTES), None where there is none or
    it lies (parse_choice)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1)
        return parse_choice(json.loads(text), builds, tiers)
    except (OSError, ValueError, RecursionError):
        return None


def write_choice(path: Path, choice: TierChoice) -> None:
    """Atomically (a finished file or none); a read-only cache keeps nothing (measured again next start)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(choice.as_json(), indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


# ------------------------------------------------------------------------------------------ measuring
def _sweeps(tier_modules: dict[str, object]) -> dict[str, dict[str, Callable[[], None]]]:
    """family -> candidate -> one sweep of that family's hot kernel on that tier's module (in that body)."""
    import torch

    k, n = 576, 1536  # SmolLM2-135M's hidden size and a projection's width
    per = lambda nbytes: max(2, _SWEEP_BYTES // nbytes)  # noqa: E731 (matrices a sweep reads)
    x = torch.full((1, k), 0.01, dtype=torch.bfloat16)
    bf16 = [torch.full((n, k), 0.02, dtype=torch.bfloat16) for _ in range(per(n * k * 2))]
    codes = [torch.full((n, k // 2), 0x5A, dtype=torch.uint8) for _ in range(per(n * k // 2))]
    sz = torch.full((n, k // 32, 2), 0.01, dtype=torch.bfloat16)
    q8 = [torch.full((n, k), 3, dtype=torch.int8) for _ in range(per(n * k))]
    scales = torch.full((n,), 0.01, dtype=torch.bfloat16)
    # attention: 8 sequences of 1024 tokens, 3 KV heads of 3 query heads each, head_dim 64, 16-token blocks
    seqs, ctx, heads, group, d, bs = 8, 1024, 3, 3, 64, 16
    kc = torch.full((heads, seqs * ctx, d), 0.01, dtype=torch.bfloat16)
    vc = torch.full_like(kc, 0.02)
    blocks = torch.arange(seqs * ctx // bs, dtype=torch.int64).view(seqs, ctx // bs)
    lens = torch.full((seqs,), ctx, dtype=torch.int64)
    q = torch.full((seqs, heads, group, d), 0.01, dtype=torch.bfloat16)

    def run(fn, items, before=lambda: None):
        return lambda: (before(), [fn(item) for item in items])

    out: dict[str, dict[str, Callable[[], None]]] = {f: {} for f in FAMILIES}
    for tier, m in tier_modules.items():
        tiles = tier in ("avx2", "avx512")  # the 4-bit layout the engine takes there (engine/quant/schemes.py)
        int4 = m.stream_linear_int4_tiles_q8 if tiles else m.stream_linear_int4_q8
        for body in BODIES["bf16"]:
            out["bf16"][f"{tier}/{body}"] = run(lambda w, m=m: m.stream_linear_bf16(x, w, None), bf16,
                                                lambda m=m, body=body: m.set_bf16_body(body))
        out["int4"][tier] = run(lambda c, int4=int4: int4(x, c, sz, 32), codes)
        out["int8"][tier] = run(lambda w, m=m: m.stream_linear_int8_q8(x, w, scales), q8)
        out["attention"][tier] = run(lambda _, m=m: m.paged_decode(q, kc, vc, blocks, lens, bs), range(16))
    return out


def measure(tier_modules: dict[str, object], rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """family -> candidate -> the fastest of `rounds` sweeps, candidates alternating within each round (a
    machine whose speed drifts, or that another process shares, drifts for all of them alike; another
    process only ever adds time), on one thread (the bodies, not how they split)."""
    import torch

    sweeps = _sweeps(tier_modules)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times: dict[str, dict[str, list[float]]] = {f: {t: [] for t in sweeps[f]} for f in FAMILIES}
        for fam in FAMILIES:
            for fn in sweeps[fam].values():
                fn()  # warm-up: page faults, first-call set-up
            for _ in range(rounds):
                for tier, fn in sweeps[fam].items():
                    t0 = time.perf_counter()
                    fn()
                    times[fam][tier].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return {f: {t: min(v) for t, v in times[f].items()} for f in FAMILIES}


def default_candidate(family: str, tiers) -> str:
    """What runs without a measurement: the best tier the CPU supports, in its first body (tiles)."""
    return candidates(family, [list(tiers)[-1]])[0]


def choose(seconds: dict[str, dict[str, float]], builds: list[str], busy_cores: float = 0.0) -> TierChoice:
    """The fastest candidate of each family, where it beats the default by more than MARGIN (else the
    default: a difference within the noise changes nothing)."""
    picks = {}
    for fam in FAMILIES:
        times = seconds[fam]
        best = min(times, key=times.get)
        default = default_candidate(fam, dict.fromkeys(c.split("/")[0] for c in times))
        keep = default in times and times[default] <= times[best] * (1 + MARGIN)
        picks[fam] = default if keep else best
    return TierChoice(picks, seconds, builds, time.strftime("%Y-%m-%d %H:%M:%S"), busy_cores)


def apply_bodies(choice: TierChoice | None, tier: str, module) -> None:
    """Set `module`'s (a `tier` build's) bodies to the choice's: the bf16 walk where the bf16 pick runs in
    this tier, else the default (tiles: the order of sums is the same, only the speed differs)."""
    if module is None or not hasattr(module, "set_bf16_body"):
        return
    body = choice.body("bf16") if choice is not None and choice.tiers["bf16"] == tier else None
    module.set_bf16_body(body or "tiles")


_LOCK = threading.Lock()
_KNOWN: dict[str, TierChoice | None] = {}  # file path -> what it held (this process reads each file once)


def known(path: Path, builds: list[str], tiers: tuple[str, ...]) -> TierChoice | None:
    """The stored choice, read once per process."""
    key = str(path)
    if key not in _KNOWN:
        _KNOWN[key] = read_choice(path, builds, tiers)
    return _KNOWN[key]


def make_choice(path: Path, builds: list[str], tier_modules: dict[str, object]) -> TierChoice:
    """Measure, store and remember the choice for these builds (one measurement at a time)."""
    with _LOCK:
        stored = read_choice(path, builds, tuple(tier_modules))  # another process may have measured meanwhile
        if stored is not None and set(stored.seconds["bf16"]) == set(candidates("bf16", tier_modules)):
            _KNOWN[str(path)] = stored
            return stored
        before = read_cpu_times()
        seconds = measure(tier_modules)
        after = read_cpu_times()
        busy = other_busy_cores(before, after) if before and after else 0.0
        choice = choose(seconds, builds, busy)
        for tier, module in tier_modules.items():
            apply_bodies(choice, tier, module)
        if busy <= BUSY_LIMIT:  # timed on a busy machine: used now, timed again at the next start
            write_choice(path, choice)
        _KNOWN[str(path)] = choice
        return choice


def forget() -> None:
    """Forget what this process read (tests: as a new process would)."""
    _KNOWN.clear()
