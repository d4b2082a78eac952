"""Where a comparison was measured: CPU model or GPU name, threads, torch version."""
from __future__ import annotations

import re


def _cpu_model() -> str:
    import torch

    from engine.perf.probe import machine_name

    return machine_name(torch.device("cpu"))


def machine_info(device: str = "cpu") -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return {"cpu": _cpu_model(), "gpu": gpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": "cuda" if gpu else "cpu"}


def machine_key(machine: dict) -> str:
    """A file-name-safe key for the per-machine store: the device's name and the thread count."""
    name = machine.get("gpu") or machine.get("cpu") or "unknown"
    return re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}-{machine.get('threads')}t").strip("-").lower()


def machine_text(machine: dict) -> str:
    """One line for the screen: "AMD EPYC 7B13, 2 threads, torch 2.13.0"."""
    name = machine.get("gpu") or machine.get("cpu") or "unknown machine"
    return f"{name}, {machine.get('threads')} threads, torch {machine.get('torch')}"
