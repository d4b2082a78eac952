"""Where a comparison was measured: CPU model or GPU name, threads, torch version."""
from __future__ import annotations

import re


def _cpu_model() -> str:
    import torch

    from engine.perf.probe import machine_name

    return machine_name(torch.device("cpu"))


def _posing_as() -> str | None:
    """How this CPU is told to behave below itself: "avx2" (INFERLAB_CPU_TIER forced a lower kernel tier),
    "emulated-bf16" (INFERLAB_EMULATED_BF16), both, or None (as it is)."""
    from engine import kernels
    from engine.runner.cpu_compute import emulated_bf16_forced

    tier, best = kernels.cpu_tier(), kernels.supported_tiers()[-1]
    parts = ([tier] if tier != best else []) + (["emulated-bf16"] if emulated_bf16_forced() else [])
    return "-".join(parts) or None


def machine_info(device: str = "cpu") -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return {"cpu": _cpu_model(), "gpu": gpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": "cuda" if gpu else "cpu", "as": None if gpu else _posing_as()}


def machine_key(machine: dict) -> str:
    """A file-name-safe key for the per-machine store: the device's name and the thread count, and the
    tier it was made to run as (a CPU measured as AVX2 keeps its native figures apart)."""
    name = machine.get("gpu") or machine.get("cpu") or "unknown"
    posing = f"-as-{machine['as']}" if machine.get("as") else ""
    return re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}-{machine.get('threads')}t{posing}").strip("-").lower()


def machine_text(machine: dict) -> str:
    """One line for the screen: "AMD EPYC 7B13, 2 threads, torch 2.13.0" (", as avx2" where forced)."""
    name = machine.get("gpu") or machine.get("cpu") or "unknown machine"
    posing = f", as {machine['as']}" if machine.get("as") else ""
    return f"{name}, {machine.get('threads')} threads{posing}, torch {machine.get('torch')}"
