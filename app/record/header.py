"""A recording's header: what ran where, so a replay can say "recorded on <machine>, <date>"."""
from __future__ import annotations

import platform
from datetime import datetime, timezone

FORMAT = "inferlab-run"
FORMAT_VERSION = 1  # a reader refuses a file of a newer version in one line


def inferlab_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferlab")
    except PackageNotFoundError:
        return "unknown"


def machine_of(device: str = "cpu", threads: int | None = None) -> dict:
    """CPU model, GPU name (where the device is one), threads: the engine's own names for them."""
    import torch

    from engine.perf.probe import machine_name

    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return {"host": platform.node(), "cpu": machine_name(torch.device("cpu")), "gpu": gpu,
            "threads": threads or torch.get_num_threads(), "torch": torch.__version__}


def make_header(what: str, *, model: str = "", device: str = "", threads: int | None = None,
                knobs: dict | None = None, machine: dict | None = None, **extra) -> dict:
    """The first line of a recording: format and version, inferlab's version, when, what ran where."""
    return {"format": FORMAT, "version": FORMAT_VERSION, "inferlab": inferlab_version(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "what": what,
            "model": model, "device": device, "threads": threads, "machine": machine or {},
            "knobs": knobs or {}, **extra}


def recorded_on(header: dict) -> str:
    """"recorded on NVIDIA H100 80GB HBM3, 2026-12-07 14:03 UTC" (the GPU where there was one, else the CPU)."""
    found = header.get("machine")
    machine: dict = found if isinstance(found, dict) else {}
    name = str(machine.get("gpu") or machine.get("cpu") or machine.get("host") or "an unknown machine")[:80]
    created = str(header.get("created", ""))[:25]
    try:
        when = datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        when = "an unknown date"
    return f"recorded on {name}, {when}"
