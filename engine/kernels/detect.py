"""What this CPU runs: its feature flags (confirmed by the CPU itself, not only listed by a file) and the
kernel tiers they allow (portable, avx2, avx512, neon). Nothing here builds or times anything."""
from __future__ import annotations

import functools
import platform
import warnings
from collections.abc import Mapping
from pathlib import Path

TIERS = ("portable", "avx2", "avx512", "neon")
_X86_NEEDS = {"avx2": {"avx2", "fma", "f16c"},
              "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                         "avx512_vnni"}}


# Linux's /proc/cpuinfo names of the x86 features the engine decides by, and the names torch's CPU probe
# (torch.cpu.get_capabilities: the cpuinfo library, which runs CPUID and checks what the OS enabled) gives them.
_CPUID_NAMES = {"avx": "avx", "avx2": "avx2", "fma": "fma3", "f16c": "f16c", "sse4_2": "sse4_2",
                "avx512f": "avx512_f", "avx512bw": "avx512_bw", "avx512vl": "avx512_vl", "avx512dq": "avx512_dq",
                "avx512cd": "avx512_cd", "avx512_bf16": "avx512_bf16", "avx512_vnni": "avx512_vnni",
                "avx512_fp16": "avx512_fp16", "avx_vnni": "avx_vnni", "amx_tile": "amx_tile", "amx_bf16": "amx_bf16",
                "amx_int8": "amx_int8"}


# aarch64 Linux: the /proc/cpuinfo "Features" the engine decides by, and their bits in the words the kernel
# hands each process (getauxval: AT_HWCAP = 16, AT_HWCAP2 = 26; linux/arch/arm64/include/uapi/asm/hwcap.h).
_HWCAP_BITS = {"fp": (16, 0), "asimd": (16, 1), "fphp": (16, 9), "asimdhp": (16, 10), "asimddp": (16, 20),
               "sve": (16, 22), "asimdfhm": (16, 23), "sve2": (26, 1), "i8mm": (26, 13), "bf16": (26, 14)}
_X86_MACHINES = ("x86_64", "amd64", "i686", "x86")
_ARM_MACHINES = ("aarch64", "arm64")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (/proc/cpuinfo: x86 "flags", Arm "Features"; macOS on
    Apple silicon: "bf16" where sysctl reports FEAT_BF16); empty where the platform says nothing. Read once
    per process: the kernels' tier and the engine's dtype choice (engine/runner/cpu_compute.py) both use it.

    A flag is kept only where the CPU itself confirms it: x86 through CPUID (torch's probe), aarch64 Linux
    through the hardware-capability words the kernel gives the process. A file can list what the CPU does
    not run (qemu-user shows the host's /proc/cpuinfo to the CPU it emulates), and a kernel built for a
    feature the CPU lacks kills the process (SIGILL), where a flag missed costs speed only. Where
    /proc/cpuinfo says nothing (Windows, macOS on Intel) the flags come from the CPU alone."""
    listed = _listed_flags()
    confirmed = _confirmed_features()
    if confirmed is None:
        return listed
    if not listed:
        return frozenset(name for name, has in confirmed.items() if has)
    denied = sorted(f for f in listed if confirmed.get(f) is False)
    if denied:
        warnings.warn(f"/proc/cpuinfo lists {', '.join(denied)} but this CPU does not run them "
                      f"({'hardware capabilities' if machine_name() in _ARM_MACHINES else 'CPUID'}): ignoring them "
                      "(an emulator, or a VM that hides them)", stacklevel=2)
    return listed - frozenset(denied)


def machine_name() -> str:
    return platform.machine().lower()


def _confirmed_features() -> dict[str, bool] | None:
    """{Linux flag name: whether the CPU itself says it runs it} for the flags the engine decides by, None
    where nothing but the file can tell."""
    if machine_name() in _X86_MACHINES:
        cpuid = _cpuid_capabilities()
        if cpuid is None:
            return None
        return {name: bool(cpuid[probe]) for name, probe in _CPUID_NAMES.items() if isinstance(cpuid.get(probe), bool)}
    if machine_name() in _ARM_MACHINES:
        words = _hwcap_words()
        if words is None:
            return None
        return {name: bool(words[at] >> bit & 1) for name, (at, bit) in _HWCAP_BITS.items()}
    return None


def _hwcap_words() -> dict[int, int] | None:
    """AT_HWCAP and AT_HWCAP2 of this process (Linux only; None elsewhere, or where they are empty)."""
    if platform.system() != "Linux":
        return None
    try:
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        words = {16: int(getauxval(16)), 26: int(getauxval(26))}
    except (OSError, AttributeError):
        return None
    return words if words[16] else None


def unconfirmed_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo lists that the CPU does not confirm (empty on a plain machine): for the
    bench JSON, so a figure taken under an emulator says so."""
    return _listed_flags() - cpu_flags()


@functools.cache
def _listed_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    wanted = "Features" if machine_name() in _ARM_MACHINES else "flags"  # not the other's (an emulator's file)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == wanted:
            return frozenset(value.split())
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        import subprocess

        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return frozenset()
        return frozenset({"bf16"}) if out == "1" else frozenset()
    return frozenset()


def _cpuid_capabilities() -> Mapping[str, object] | None:
    """torch's view of the CPU (CPUID and the OS's enabled state; not changed by ATEN_CPU_CAPABILITY),
    None where this torch has no such probe."""
    try:
        import torch.cpu

        caps = torch.cpu.get_capabilities()
    except Exception:  # noqa: BLE001 (an old torch, or a probe that fails: trust the file)
        return None
    return caps if isinstance(caps, Mapping) and caps.get("avx2") is not None else None


def supported_tiers(flags: frozenset[str] | None = None, machine: str | None = None) -> tuple[str, ...]:
    """The tiers this CPU runs, worst first (portable always). With neither /proc/cpuinfo nor torch's CPUID
    probe, torch's own CPU capability decides between portable and avx2 (it does not tell bf16 or VNNI:
    never avx512 then)."""
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    if machine in _ARM_MACHINES:
        return ("portable", "neon")  # Advanced SIMD is part of every AArch64 CPU
    if machine not in _X86_MACHINES:
        return ("portable",)
    if not flags:
        return ("portable", "avx2") if _torch_capability() in ("AVX2", "AVX512") else ("portable",)
    return ("portable",) + tuple(t for t in ("avx2", "avx512") if _X86_NEEDS[t] <= flags)


def _torch_capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 (an old torch: assume nothing)
        return "DEFAULT"


def neon_with_sdot(tier: str) -> bool:
    """Whether `tier` is NEON built with sdot (where the CPU has the dot-product instructions)."""
    return tier == "neon" and "asimddp" in cpu_flags()
