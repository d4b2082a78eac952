"""Which tier each kernel family runs: INFERLAB_CPU_TIER where set, else the one measured fastest for the
family on this CPU (tier_choice.py times and stores it beside the builds), else the best this CPU supports;
and the choice in words for the engine line and the bench JSON."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from engine.kernels import build, detect, load
from engine.kernels import tier_choice as _tier_choice

_WHAT = {"portable": "plain C++", "avx2": "AVX2 + FMA", "avx512": "AVX-512 bf16 + VNNI", "neon": "Arm NEON"}


def forced_tier() -> str | None:
    """The tier INFERLAB_CPU_TIER names where this CPU runs it; None where unset (a tier it cannot run is
    refused with a warning: the best one runs)."""
    tiers = detect.supported_tiers()
    forced = os.environ.get("INFERLAB_CPU_TIER", "").strip().lower()
    if not forced:
        return None
    if forced in tiers:
        return forced
    warnings.warn(f"INFERLAB_CPU_TIER={forced!r}: this CPU runs {', '.join(tiers)}; using {tiers[-1]}",
                  stacklevel=3)
    return tiers[-1]


def cpu_tier(family: str | None = None) -> str:
    """The tier `family`'s kernels run (tier_choice.FAMILIES; default "bf16"): INFERLAB_CPU_TIER where set,
    else the tier measured fastest for the family on this CPU (tier_choice.py), else (not measured yet) the
    best this CPU supports."""
    forced = forced_tier()
    if forced is not None:
        return forced
    choice = measured_choice()
    return choice.tiers[family or "bf16"] if choice is not None else detect.supported_tiers()[-1]


def timed_tiers() -> tuple[str, ...]:
    """The tiers whose bodies are timed against each other: every SIMD tier this CPU runs (on x86 with
    AVX-512: avx2 and avx512). Not portable where a SIMD tier runs: its plain C++ is the fallback for CPUs
    with none, slower than any SIMD body by construction, and one more build to wait for at the first start."""
    tiers = detect.supported_tiers()
    return tiers if len(tiers) == 1 else tuple(t for t in tiers if t != "portable")


def measured_choice():
    """The measured choice (tier_choice.py's TierChoice) stored for this CPU's builds, None where there is
    none yet or only one tier to choose from."""
    tiers = timed_tiers()
    if len(tiers) < 2:
        return None
    builds = [build.build_name(t) for t in tiers]
    try:
        path = choice_path(builds)
    except Exception:  # noqa: BLE001 (torch's extension folder unknown: nothing stored)
        return None
    return _tier_choice.known(path, builds, tiers)


def choice_path(builds: list[str]) -> Path:
    """The choice's file, beside the builds in torch's extension cache, named after all of them."""
    import hashlib

    key = hashlib.sha256(" ".join(builds).encode()).hexdigest()[:12]
    return load.build_dir(builds[-1]).parent / f"inferlab_tier_choice_{key}.json"


def choice_summary() -> dict:
    """For the bench JSON: each family's tier (and walk), and how it was chosen ("measured" with the timings,
    "forced by INFERLAB_CPU_TIER", or "not timed")."""
    choice = measured_choice()
    forced = forced_tier()
    families = {f: cpu_tier(f) for f in _tier_choice.FAMILIES}
    if forced is None and choice is not None:
        return {"how": "measured", "picks": choice.picks, "seconds_per_sweep": choice.seconds,
                "measured": choice.measured, "tiers": families}
    how = "forced by INFERLAB_CPU_TIER" if forced else "not timed (one tier, or not measured yet)"
    return {"how": how, "tiers": families}


def describe_tier(tier: str | None = None) -> str:
    """The tier in words, for the engine line and the bench JSON: "avx2 (AVX2 + FMA)"; on NEON whether the
    build uses sdot (the int8 dot products of the 4- and 8-bit kernels), "neon (Arm NEON + sdot)"."""
    tier = tier or cpu_tier()
    return f"{tier} ({_WHAT[tier]}{' + sdot' if detect.neon_with_sdot(tier) else ''})"


def describe_choice(family: str | None = None) -> str:
    """How `family`'s tier was chosen, for the engine line: "avx512 (AVX-512 bf16 + VNNI), timed fastest
    for bf16 (avx2 1.31x its time, ...)", "forced by INFERLAB_CPU_TIER", or "the best this CPU supports"."""
    family = family or "bf16"
    tier = cpu_tier(family)
    if forced_tier() is not None:
        return f"{describe_tier(tier)}, forced by INFERLAB_CPU_TIER"
    choice = measured_choice()
    if choice is None:
        one = len(timed_tiers()) < 2
        only = f"the only {'SIMD ' if tier != 'portable' else ''}tier this CPU runs"
        why = only if one else "the best this CPU supports (not timed yet)"
        return f"{describe_tier(tier)}, {why}"
    pick = choice.picks[family]
    others = ", ".join(f"{c} {r:.2f}x" for c, r in choice.ratios(family).items() if c != pick)
    body = f" in its {choice.body(family)} walk" if choice.body(family) else ""
    return (f"{describe_tier(tier)}{body}, timed fastest for {family} within {_tier_choice.MARGIN:.0%}"
            + (f" ({others} its time)" if others else ""))
