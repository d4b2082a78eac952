"""Which tier's bodies run, chosen by measuring them on this CPU, per kernel family (issue 47).

A CPU's features say which tiers it *can* run, not which is fastest: a Zen 4 runs AVX-512 as two 256-bit
halves, and bf16 dot products cost differently by vendor (the tier picked by features ran the bf16 decode
~1.7x slower than the AVX2 one there). So at the first build every SIMD tier this CPU runs is built and timed
on what the engine runs: for each weight family (bf16, 4-bit, 8-bit) a whole fused decode step of a model of
SmolLM2-135M's layer shapes (~96 M weights in one huge-page arena, read from memory; int8 activations for
the quantized ones, the engine's default), the bf16 one in both walks of the weights ("tiles", "rows": the
same numbers, core/linear.h); for the attention family the layer path's paged attention. Eleven rounds,
candidates alternating, the fastest of each kept (another process only ever adds time). Each family keeps
the highest tier among the candidates within MARGIN of the fastest (in it, the faster walk).
The choice is kept in a file beside the builds, named after them: it lives as long as they do (a new source
or compiler flag is a new build name, so a new file, measured again); one timed while other processes kept
more than BUSY_LIMIT cores busy is used but not kept; and a file that lies (names a tier this CPU does not
run, does not match the builds, or whose pick is not its own fastest time) is ignored and measured anew.
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
from functools import partial
from pathlib import Path
from typing import Any

from engine.kernels.cpu_times import other_busy_cores, read_cpu_times
from engine.kernels.huge_arena import arena

FAMILIES = ("bf16", "int4", "int8", "attention")
MARGIN = 0.05  # candidates this close to the fastest count as fast as it (the highest tier among them runs)
BUSY_LIMIT = 0.5  # cores other processes kept busy while timing, past which the choice is not stored
BODIES = {"bf16": ("tiles", "rows", "stream")}  # families timed in several walks of the weights, within each tier
VERSION = 6
ROUNDS = 11  # sweeps per tier and family, alternating tiers (the fastest is kept: interference only adds time)
MAX_FILE_BYTES = 64 * 1024


def family_for_format(name: str) -> str:
    """The kernel family that runs weights of the format `name` (EngineConfig.quant_format): int4 and int8
    their own; bf16 and fp8-e4m3 (widened to bf16 for the product) the bf16 bodies."""
    return {"int4": "int4", "int8": "int8"}.get(str(name), "bf16")


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
# SmolLM2-135M's shapes: hidden 576, intermediate 1536, 9 query heads on 3 KV heads of 64, its vocabulary (the
# tied embedding its lm_head, bf16), 30 layers: every step reads them from memory (many times an L3)
_H, _I, _HEADS, _KV, _D, _VOCAB, _LAYERS, _CTX = 576, 1536, 9, 3, 64, 49152, 30, 64
_KINDS = {"bf16": 0, "int8": 1, "int4": 3}  # the fused step's Proj kinds (fused_decode.cpp); int4: tiles


def _shapes() -> list[tuple[int, int]]:
    """(N, K) of every projection, in the order a step reads them: qkv, o_proj, gate_up, down_proj a layer."""
    return [(_HEADS * _D + 2 * _KV * _D, _H), (_H, _HEADS * _D), (2 * _I, _H), (_H, _I)] * _LAYERS


def _model_weights(kind: int) -> tuple:
    """(embedding table, [(a, b, group) per projection]) holding random values, the large tensors in one
    huge-page arena in reading order, as the engine keeps its weights. Random: pages of one value may be
    merged (a hypervisor's KSM) and then be read from cache, not memory."""
    import torch

    per = {0: 2.0, 1: 1.0, 2: 0.5, 3: 0.5}[kind]
    flat = arena(_VOCAB * _H * 2 + int(sum(n * k for n, k in _shapes()) * per))
    gen = torch.Generator().manual_seed(0)
    at = [0]

    def take(dtype, shape):
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        raw = flat[at[0]:at[0] + size]
        at[0] += size
        bits = raw.view(torch.int16).random_(generator=gen)  # 16 bits at a time (bytes: 3x as long)
        if dtype == torch.bfloat16:  # 1/128 to 2: finite, not subnormal
            bits.bitwise_and_(0x03ff).bitwise_or_(0x3c00)
        return raw.view(dtype).view(shape)

    table = take(torch.bfloat16, (_VOCAB, _H))
    projs = []
    for n, k in _shapes():
        if kind == 0:
            projs.append((take(torch.bfloat16, (n, k)), torch.empty(0), 0))
        elif kind == 1:
            projs.append((take(torch.int8, (n, k)), torch.full((n,), 0.01, dtype=torch.bfloat16), 0))
        else:
            projs.append((take(torch.uint8, (n, k // 2)), torch.full((n, k // 32, 2), 0.01, dtype=torch.bfloat16), 32))
    return table, projs


def _fused_step(m, kind: int, weights: tuple) -> Callable[[], None]:
    """One decode step (one row, a 64-token context) of a model of SmolLM2-135M's shapes over `weights`
    (_model_weights(kind)), run by module `m`'s fused step on this thread: what the engine runs (timing the
    products one op call at a time hid a 13 % difference between two bf16 bodies under the dispatch)."""
    import torch

    table, proj_args = weights
    projs = [m.Proj(kind, *args, None) for args in proj_args]
    ones = torch.ones(_H, dtype=torch.bfloat16)
    head = m.Proj(0, table, torch.empty(0), 0, None)
    angles = torch.arange(256, dtype=torch.float32)[:, None] * torch.linspace(0, 1, _D)[None, :]
    model = m.FusedModel(_H, _HEADS, _KV, _D, _I, 1e-5, table, None, ones, head, angles.cos(), angles.sin())
    for i in range(_LAYERS):
        cache = [torch.zeros(_KV, 256, _D, dtype=torch.bfloat16) for _ in range(2)]
        model.add_layer(ones, ones, None, None, *projs[4 * i:4 * i + 4], *cache)
    model.set_int8_activations(kind != 0)  # the engine's default (EngineConfig.int8_activations)
    one = torch.tensor([1])
    pos = torch.tensor([_CTX - 1])
    blocks, lens = torch.arange(_CTX // 16).view(1, -1), torch.tensor([_CTX])
    return lambda: model.step(one, pos, pos, blocks, lens, 16, False, None)


def _family_sweeps(family: str, tier_modules: dict[str, object]) -> dict[str, Callable[[], object]]:
    """candidate -> one run of `family`'s hot kernels on that tier's module (in that body); its data made now
    (and dropped with the sweeps): a fused decode step for the weight families, the paged attention op for
    the attention family (the layer path's)."""
    import torch

    out: dict[str, Callable[[], object]] = {}
    if family in _KINDS:
        # 4-bit: the tiles layout where the engine keeps it (engine/quant/schemes.py), else the chunks (the same
        # bytes: only the kind the step reads them as differs)
        kinds = {t: 2 if _KINDS[family] == 3 and t not in ("avx2", "avx512") else _KINDS[family] for t in tier_modules}
        weights = _model_weights(next(iter(kinds.values())))  # one copy, read by every tier's step
        for tier, m in tier_modules.items():
            step = _fused_step(m, kinds[tier], weights)
            for body in BODIES.get(family, ("",)):
                cand = f"{tier}/{body}" if body else tier
                out[cand] = partial(_with_body, m, body, step) if body else step
        return out
    # attention: 8 sequences of 1024 tokens, 3 KV heads of 3 query heads each, head_dim 64, 16-token blocks
    seqs, ctx, bs = 8, 1024, 16
    kc = torch.full((_KV, seqs * ctx, _D), 0.01, dtype=torch.bfloat16)
    vc = torch.full_like(kc, 0.02)
    blocks = torch.arange(seqs * ctx // bs, dtype=torch.int64).view(seqs, ctx // bs)
    lens = torch.full((seqs,), ctx, dtype=torch.int64)
    q = torch.full((seqs, _KV, _HEADS // _KV, _D), 0.01, dtype=torch.bfloat16)
    for tier, m in tier_modules.items():
        out[tier] = partial(_attention_sweep, m, q, kc, vc, blocks, lens, bs)
    return out


def _with_body(module: Any, body: str, step: Callable[[], object]) -> object:
    module.set_bf16_body(body)
    return step()


def _attention_sweep(module: Any, q, kc, vc, blocks, lens, bs: int) -> list:
    return [module.paged_decode(q, kc, vc, blocks, lens, bs) for _ in range(16)]


def measure(tier_modules: dict[str, object], rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """family -> candidate -> the fastest of `rounds` sweeps, candidates alternating within each round (a
    machine whose speed drifts, or that another process shares, drifts for all of them alike; another
    process only ever adds time), on one thread (the bodies, not how they split)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    times: dict[str, dict[str, float]] = {}
    try:
        for fam in FAMILIES:
            sweeps = _family_sweeps(fam, tier_modules)
            for fn in sweeps.values():
                fn()  # warm-up: page faults, first-call set-up
            seen: dict[str, list[float]] = {c: [] for c in sweeps}
            for _ in range(rounds):
                for cand, fn in sweeps.items():
                    t0 = time.perf_counter()
                    fn()
                    seen[cand].append(time.perf_counter() - t0)
            times[fam] = {c: min(v) for c, v in seen.items()}
    finally:
        torch.set_num_threads(before)
    return times


def choose(seconds: dict[str, dict[str, float]], builds: list[str], busy_cores: float = 0.0) -> TierChoice:
    """Each family's candidate: among those within MARGIN of the fastest (a difference within the noise
    decides nothing), the highest tier (the one the CPU's features pick), and in it the fastest walk.
    Candidates come in tier order, lowest first (tier_modules' order)."""
    picks = {}
    for fam in FAMILIES:
        times = seconds[fam]
        rank = {t: i for i, t in enumerate(dict.fromkeys(c.split("/")[0] for c in times))}
        near = [c for c in times if times[c] <= min(times.values()) * (1 + MARGIN)]
        picks[fam] = max(near, key=lambda c: (rank[c.split("/")[0]], -times[c]))
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
        if busy <= BUSY_LIMIT:  # timed on a busy machine: used now, timed again at the next start
            write_choice(path, choice)
        _KNOWN[str(path)] = choice
        return choice


def forget() -> None:
    """Forget what this process read (tests: as a new process would)."""
    _KNOWN.clear()
