"""Native CPU kernels: one C++ module (module.cpp) built with torch.utils.cpp_extension once per machine and
ISA tier, like ggml's CPU variants. It holds:

- the weight-streaming products (stream_linear.cpp over core/linear.h): Linear layers for a few rows
  (decode) that read each weight once, from the one copy the engine keeps: bf16 rows, int8 rows, 4-bit
  codes with group scales, with float or int8 activations;
- the paged decode attention (paged_decode.cpp over core/attention.h): K and V streamed from the paged
  cache where they lie (EngineConfig.attention_backend "native");
- the fused decode step (fused_decode.cpp over core/ops.h): the whole transformer for 1..8 decode rows in
  one native call and one OpenMP parallel region (EngineConfig.fused_decode, engine/runner/fused.py).

Tiers (core/isa.h): "avx512" (AVX-512 with bf16 dot products and VNNI), "avx2" (AVX2 + FMA + F16C),
"neon" (AArch64, sdot where the CPU has it) and "portable" (plain C++). Each tier is its own build (its
compiler flags, its name), so the tests build and check every tier the test machine can run. Which one
runs is measured, per kernel family (bf16 rows, 4-bit rows, 8-bit rows, attention): at the first build
every tier this CPU runs is built and timed, and the fastest of each family is kept beside the builds
(tier_choice.py); `cpu_tier(family)` says it. INFERLAB_CPU_TIER=portable|avx2|avx512|neon forces one.

Where the compiler has no OpenMP (macOS's Apple clang) the kernels are built without it and split their
work over a small pool of their own threads (threads.h); INFERLAB_KERNELS_OPENMP=0 builds them so anywhere.
Where no C++ compiler is found (Windows without a toolchain) the build fails once, one line says so, and the
engine runs on torch's kernels. The first build takes ~25-60 s:
`build_in_background` starts it in a thread while the engine runs on torch's kernels (the app does this).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path

from engine.kernels import tier_choice as _tier_choice

TIERS = ("portable", "avx2", "avx512", "neon")
_X86_NEEDS = {"avx2": {"avx2", "fma", "f16c"},
              "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                         "avx512_vnni"}}
_FLAGS = {
    "portable": ["-DINFERLAB_PORTABLE"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
               "-mavx512vnni"],
    "neon": ["-march=armv8-a"],  # + dotprod where the CPU has it (_tier_flags)
}
_WHAT = {"portable": "plain C++", "avx2": "AVX2 + FMA", "avx512": "AVX-512 bf16 + VNNI", "neon": "Arm NEON"}

_BUILT: dict[str, object] = {}  # build name -> the loaded module, or None after a failed build
_PENDING: dict[str, Future] = {}  # build name -> its background build
_FAILED: dict[str, str] = {}  # build name -> the first line of why it failed
_LOCK = threading.Lock()  # one build at a time in this process (background thread and callers)
_PENDING_LOCK = threading.Lock()  # _PENDING only: never held during a build, so asking never waits on one
_CHOICE_KEY = "tier-choice"  # _PENDING's key for the tiers' timing in the background (choose_tiers)


# ---------------------------------------------------------------------------------------- the CPU's tier
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
                      f"({'hardware capabilities' if _machine() in _ARM_MACHINES else 'CPUID'}): ignoring them "
                      "(an emulator, or a VM that hides them)", stacklevel=2)
    return listed - frozenset(denied)


def _machine() -> str:
    return platform.machine().lower()


def _confirmed_features() -> dict[str, bool] | None:
    """{Linux flag name: whether the CPU itself says it runs it} for the flags the engine decides by, None
    where nothing but the file can tell."""
    if _machine() in _X86_MACHINES:
        cpuid = _cpuid_capabilities()
        if cpuid is None:
            return None
        return {name: cpuid[probe] for name, probe in _CPUID_NAMES.items() if isinstance(cpuid.get(probe), bool)}
    if _machine() in _ARM_MACHINES:
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
    wanted = "Features" if _machine() in _ARM_MACHINES else "flags"  # not the other's (an emulator's file)
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


def forced_tier() -> str | None:
    """The tier INFERLAB_CPU_TIER names where this CPU runs it; None where unset (a tier it cannot run is
    refused with a warning: the best one runs)."""
    tiers = supported_tiers()
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
    return choice.tiers[family or "bf16"] if choice is not None else supported_tiers()[-1]


def timed_tiers() -> tuple[str, ...]:
    """The tiers whose bodies are timed against each other: every SIMD tier this CPU runs (on x86 with
    AVX-512: avx2 and avx512). Not portable where a SIMD tier runs: its plain C++ is the fallback for CPUs
    with none, slower than any SIMD body by construction, and one more build to wait for at the first start."""
    tiers = supported_tiers()
    return tiers if len(tiers) == 1 else tuple(t for t in tiers if t != "portable")


def measured_choice():
    """The measured choice (tier_choice.py's TierChoice) stored for this CPU's builds, None where there is
    none yet or only one tier to choose from."""
    tiers = timed_tiers()
    if len(tiers) < 2:
        return None
    builds = [_build_name(t) for t in tiers]
    try:
        path = _choice_path(builds)
    except Exception:  # noqa: BLE001 (torch's extension folder unknown: nothing stored)
        return None
    return _tier_choice.known(path, builds, tiers)


def _choice_path(builds: list[str]) -> Path:
    """The choice's file, beside the builds in torch's extension cache, named after all of them."""
    import hashlib

    key = hashlib.sha256(" ".join(builds).encode()).hexdigest()[:12]
    return _build_dir(builds[-1]).parent / f"inferlab_tier_choice_{key}.json"


def choice_pending() -> bool:
    """Whether the tiers are being built and timed in the background right now."""
    future = _PENDING.get(_CHOICE_KEY)
    return future is not None and not future.done()


def choose_tiers(progress: Callable[[str, float], None] | None = None):
    """Build every tier timed_tiers names and time them (tier_choice.py), once per machine and build; the
    choice, or None where fewer than two tiers build (then each family runs the best that did)."""
    tiers = timed_tiers()
    if forced_tier() is not None or len(tiers) < 2:
        return None
    stored = measured_choice()
    if stored is not None:
        return stored
    if progress is not None:
        progress(f"building the native kernels for {', '.join(tiers)} to time them (once per machine)", 0.95)
    modules = {t: m for t in tiers if (m := _build(_build_name(t), t, None)) is not None}
    if len(modules) < 2:
        return None
    builds = [_build_name(t) for t in tiers]
    choice = _tier_choice.make_choice(_choice_path(builds), builds, modules)
    for tier, module in modules.items():  # the choice's walks of W (a stored one, read meanwhile, too)
        _tier_choice.apply_bodies(choice, tier, module)
    return choice


def _in_background(key: str, work: Callable[[], object], name: str) -> Future:
    """work() in a daemon thread, once per key (_PENDING holds its future: its result, or its exception)."""
    with _PENDING_LOCK:
        if key in _PENDING:
            return _PENDING[key]
        future: Future = Future()
        _PENDING[key] = future

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on the future)
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _choose_in_background() -> Future:
    """Every timed tier built (each its own future, one at a time) and timed, in a thread (once); the
    future's result is the choice or None."""
    def work():
        try:
            for build in [build_in_background(t) for t in timed_tiers()]:
                build.result()
            return choose_tiers()
        except Exception as exc:  # noqa: BLE001 (a failed timing: the best tier runs; say why)
            warnings.warn(f"native kernels: timing the tiers failed ({_first_line(exc)}); the best tier runs",
                          stacklevel=2)
            return None

    return _in_background(_CHOICE_KEY, work, "inferlab-kernels-choice")


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
    return f"{tier} ({_WHAT[tier]}{' + sdot' if _neon_sdot(tier) else ''})"


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


def _neon_sdot(tier: str) -> bool:
    """Whether `tier` is NEON built with sdot (where the CPU has the dot-product instructions)."""
    return tier == "neon" and "asimddp" in cpu_flags()


def _tier_flags(tier: str) -> list[str]:
    if _neon_sdot(tier):
        return ["-march=armv8.2-a+dotprod"]
    return list(_FLAGS[tier])


# ------------------------------------------------------------------------------------------ the loaders
def native_decode_applies(model_config, device, dtype) -> bool:
    """The kernel's cases: bf16 on the CPU, head_dim 64 or 128, at most 8 query heads per KV head."""
    import torch

    group = model_config.num_attention_heads // model_config.num_key_value_heads
    return (device.type == "cpu" and dtype == torch.bfloat16 and model_config.head_dim in (64, 128)
            and group <= 8)


def kernel_module(progress: Callable[[str, float], None] | None = None, tier: str | None = None,
                  wait: bool = True, family: str | None = None):
    """The native module for `tier` (default: cpu_tier(family), the tiers built and timed first where they
    have not been: choose_tiers), built once per machine; None where it cannot be built (after one warning:
    callers run torch's kernels then). `wait=False`: the module if it is built already, else None at once,
    with its build (or the tiers' timing) started in the background (`build_pending`)."""
    if tier is None and forced_tier() is None and len(timed_tiers()) > 1 and measured_choice() is None:
        if not wait:
            _choose_in_background()
            return None
        choose_tiers(progress)
    tier = tier or cpu_tier(family)
    if tier not in TIERS:
        raise ValueError(f"unknown CPU tier {tier!r}; one of {', '.join(TIERS)}")
    name = _build_name(tier)
    if name in _BUILT:
        return _BUILT[name]
    if not wait:
        built = _import_built(name)
        if built is not None:
            _tier_choice.apply_bodies(measured_choice(), tier, built)
            _BUILT[name] = built
            return built
        build_in_background(tier)
        return None
    return _build(name, tier, progress)


# The three names callers use; one module holds all three since the kernels are one translation unit.
def paged_decode_kernel(progress=None, tier: str | None = None, wait: bool = True):
    """The module whose `paged_decode` runs decode attention over the paged cache (see kernel_module): the
    attention family's tier."""
    return kernel_module(progress, tier, wait, family="attention")


def stream_linear_kernel(progress=None, tier: str | None = None, wait: bool = True, family: str | None = None):
    """The module whose stream_linear_* run the weight-streaming products (see kernel_module): `family`'s
    tier (the weights' family: bf16, int4, int8)."""
    return kernel_module(progress, tier, wait, family)


def fused_decode_kernel(progress=None, tier: str | None = None, wait: bool = True, family: str | None = None):
    """The module whose FusedModel / Proj run the fused decode step (see kernel_module): `family`'s tier
    (the weights': the step's attention runs in the same build)."""
    return kernel_module(progress, tier, wait, family)


def build_in_background(tier: str | None = None) -> Future:
    """Start building `tier`'s module in a thread (once); the future's result is the module or None."""
    tier = tier or cpu_tier()
    name = _build_name(tier)
    return _in_background(name, lambda: _build(name, tier, None), f"inferlab-kernels-{tier}")


def build_pending(tier: str | None = None) -> bool:
    """Whether `tier`'s module (default: the engine's) is being built in the background right now, or the
    tiers are being built and timed (which builds it too)."""
    if choice_pending():
        return True
    future = _PENDING.get(_build_name(tier or cpu_tier()))
    return future is not None and not future.done()


def status(tier: str | None = None, family: str | None = None) -> str:
    """The kernels in words for the engine line: "avx512 (…), timed fastest for bf16 within 5 % (avx2 1.31x its
    time)", "building avx2 (…)" or why not."""
    if tier is None and choice_pending():
        return (f"building and timing {', '.join(timed_tiers())} in the background (once per machine); "
                "torch's kernels meanwhile")
    tier = tier or cpu_tier(family)
    name = _build_name(tier)
    if build_pending(tier):
        return f"building {describe_tier(tier)} in the background; torch's kernels meanwhile"
    if name in _BUILT and _BUILT[name] is None:
        return f"unavailable ({_FAILED.get(name, 'no C++ compiler')}); torch's kernels"
    if name in _BUILT and not built_with_openmp(_BUILT[name]):
        return f"{describe_choice(family)}, built without OpenMP: their own thread pool"
    return describe_choice(family)


def built_with_openmp(module) -> bool:
    """Whether a built module splits its work over OpenMP's threads (else over its own pool, threads.h)."""
    return bool(module.openmp()) if hasattr(module, "openmp") else True


# ------------------------------------------------------------------------------------------- the build
_SOURCES = ("module.cpp", "stream_linear.cpp", "paged_decode.cpp", "fused_decode.cpp", "torch_common.h",
            "threads.h")
OPENMP_ENV = "INFERLAB_KERNELS_OPENMP"  # "0": build without OpenMP (the tests; as on macOS)


def _openmp_wanted() -> bool:
    return os.environ.get(OPENMP_ENV, "").strip() != "0"


def _build_name(tier: str, openmp: bool | None = None) -> str:
    """The build's name (torch's extension cache folder): the tier, whether it has OpenMP, and a hash of the
    sources, the tier's compiler flags and the architecture. A cache can be shared by machines (a home on
    NFS, a container image): on NEON the flags differ by CPU (a build with sdot would die on an Arm CPU
    without it), and the portable tier's flags are the same on x86 and Arm."""
    import hashlib

    openmp = _openmp_wanted() if openmp is None else openmp
    variant = "neon_sdot" if _neon_sdot(tier) else tier
    digest = hashlib.sha256(" ".join([_source_digest(), _machine(), *_tier_flags(tier)]).encode()).hexdigest()[:10]
    return f"inferlab_kernels_{variant}{'' if openmp else '_noomp'}_{digest}"


@functools.cache  # read once per process: the loaders are called on hot paths
def _source_digest() -> str:
    """A short hash of every source the module compiles, part of its build name: two checkouts with
    different sources (worktrees, versions) build into different folders of torch's extension cache."""
    import hashlib

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for f in sorted([*(here / s for s in _SOURCES), *(here / "core").glob("*.h")]):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:10]


def _build(name: str, tier: str, progress: Callable[[str, float], None] | None):
    """Build (once per machine) or load the module; None after a failed build (one warning, one line)."""
    with _LOCK:
        if name in _BUILT:
            return _BUILT[name]
        if progress is not None:
            progress(f"loading the native kernels ({tier})" if _is_built(name)
                     else f"building the native kernels for {describe_tier(tier)} (once per machine, ~25-60 s)", 0.95)
        built = _import_built(name)
        without = _build_name(tier, openmp=False)
        if built is None and without != name:
            built = _import_built(without)  # this machine's compiler had no OpenMP before: its build
        if built is None:
            built = _compile(name, tier)
        _tier_choice.apply_bodies(measured_choice(), tier, built)
        _BUILT[name] = built
        return built


def _compile(name: str, tier: str):
    """Build `name`; where a build with OpenMP fails, once more without it (as on macOS's Apple clang,
    which refuses -fopenmp); None after one warning where neither builds."""
    without = _build_name(tier, openmp=False)
    try:
        return _load(name, tier, openmp=name != without)
    except Exception as exc:  # noqa: BLE001 (any build failure means: use torch's kernels)
        why = _first_line(exc)
    if name != without:
        try:
            built = _load(without, tier, openmp=False)
            warnings.warn(f"native kernels ({tier}) built without OpenMP (their own thread pool): {why}",
                          stacklevel=4)
            return built
        except Exception:  # noqa: BLE001 (the first failure says more: it is the one reported)
            pass
    _FAILED[name] = why
    warnings.warn(f"native kernels ({tier}) unavailable, running on torch's kernels: {why}", stacklevel=4)
    return None


def _load(name: str, tier: str, openmp: bool):
    from torch.utils.cpp_extension import load

    with _machine_build_lock(name):
        built = _import_built(name, locked=True)  # another process may have built it while this one waited
        if built is not None:
            return built
        _clear_dead_lock(name)
        omp = ["-fopenmp"] if openmp else []
        module = load(name=name, sources=[str(Path(__file__).with_name("module.cpp"))],
                      extra_cflags=["-O3", *omp, *_tier_flags(tier)], extra_ldflags=omp, verbose=False)
        _write_digest(_build_dir(name) / f"{name}.so")  # finished: loadable without the lock from now on
        return module


def _first_line(exc: Exception) -> str:
    """The part of a build error a person can act on: the compiler's first error line, else the message."""
    text = str(exc)
    for line in text.splitlines():
        if "error" in line.lower() and "ninja" not in line.lower():
            return line.strip()[:300]
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def _import_built(name: str, locked: bool = False):
    """The module built earlier under this name (its name holds the sources' digest, so a built one is
    current), imported straight from torch's extension cache; None where there is none. torch's `load`
    takes a lock on the build folder even to find a build up to date, and a process killed meanwhile
    leaves it behind: loading what is built needs no lock.

    A damaged module (a build killed while linking, a full disk, a file changed since) would not fail to
    load: it kills the process (SIGBUS), on every start. So outside the machine build lock (`locked`
    False) only a module whose digest was written when its build finished is loaded (one being built by
    another process has none yet); under it, where no build runs, one without a digest (built before
    digests were written) is loaded where its ELF structure is whole, and a damaged one is removed, saying
    so, for the build to make again."""
    import importlib.util

    try:
        import torch  # noqa: F401 (the extension links against torch's libraries: load them first)

        so = _build_dir(name) / f"{name}.so"
        if not so.is_file():
            return None
        state = _digest_state(so)
        if state != "verified":
            if not locked:
                return None
            if state == "damaged" or not _binary_whole(so):
                _discard_damaged(so)
                return None
        spec = importlib.util.spec_from_file_location(name, so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if state != "verified":
            _write_digest(so)
        return module
    except Exception:  # noqa: BLE001 (anything odd: build it again, and say what the build finds)
        return None


def _digest_path(so: Path) -> Path:
    return so.with_name(so.name + ".inferlab-sha256")


def _file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_state(so: Path) -> str:
    """"verified" (the digest written when its build finished matches), "damaged" (it does not), or
    "unverified" (none written: built by an older inferlab, or a build still under way)."""
    try:
        written = _digest_path(so).read_text().strip()
    except OSError:
        return "unverified"
    return "verified" if written == _file_digest(so) else "damaged"


def _write_digest(so: Path) -> None:
    try:
        tmp = _digest_path(so).with_suffix(".tmp")
        tmp.write_text(_file_digest(so) + "\n")
        tmp.replace(_digest_path(so))
    except OSError:
        pass  # a read-only cache: the module is loaded under the lock each time, as before


_ELF_MAGIC = b"\x7fELF"
_MACHO_MAGICS = (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe")


def _binary_whole(path: Path) -> bool:
    """Whether a built binary is whole as far as its own headers say: for 64-bit little-endian ELF (Linux
    on x86-64 and AArch64) the header tables and every segment and section with contents lie inside the
    file (a truncated build fails). Mach-O (macOS) passes: its digest alone guards it. Anything else, or
    a file too short for a header (a zero-filled or emptied file), fails."""
    import struct

    try:
        data = path.read_bytes()
    except OSError:
        return False
    size = len(data)
    if size < 64:
        return False
    if data[:4] in _MACHO_MAGICS:
        return True
    if data[:4] != _ELF_MAGIC:
        return False
    if data[4] != 2 or data[5] != 1:  # not ELF64 little-endian: nothing here reads its layout
        return True
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return False
    for i in range(phnum):
        offset, filesz = struct.unpack_from("<Q16xQ", data, phoff + i * phentsize + 8)
        if offset + filesz > size:
            return False
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, length = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        if sh_type != 8 and offset + length > size:  # 8: SHT_NOBITS (.bss) has no bytes in the file
            return False
    return True


def _discard_damaged(so: Path) -> None:
    """Remove a damaged module, its digest, and any object file beside it that is damaged too, so that the
    build makes them again (a whole object file is kept: the build only links again)."""
    removed = []
    for path in [so, *sorted(so.parent.glob("*.o"))]:
        if path == so or not _binary_whole(path):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    with contextlib.suppress(OSError):
        _digest_path(so).unlink()
    warnings.warn(f"native kernels: the built module {so} was damaged (cut short, or changed since it was built); "
                  f"removed {', '.join(removed)} to build it again", stacklevel=5)


def _build_dir(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _is_built(name: str) -> bool:
    """Whether torch's extension cache already holds this module (then loading it takes a moment)."""
    try:
        return (_build_dir(name) / f"{name}.so").is_file()
    except Exception:  # noqa: BLE001 (a private helper of torch's: if it moves, say "building")
        return False


@contextlib.contextmanager
def _machine_build_lock(name: str):
    """An exclusive lock on this build across processes, held while compiling. The kernel releases it when
    its holder dies, so a process that finds torch's own lock file while holding this one knows that
    file was left by a build that died (where flock is missing, Windows, the lock file's age decides)."""
    path = _build_dir(name).with_suffix(".inferlab-lock")
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


STALE_LOCK_S = 600  # without flock: a lock this old was left by a process killed mid-build


def _clear_dead_lock(name: str) -> None:
    """torch waits forever on the build lock a killed build leaves behind. Under the machine build lock no
    live process is building, so a lock file there is dead: removed at once, saying so (without flock:
    one older than any real build)."""
    try:
        import fcntl  # noqa: F401
        have_flock = True
    except ImportError:
        have_flock = False
    try:
        lock = _build_dir(name) / "lock"
        if lock.exists() and (have_flock or time.time() - lock.stat().st_mtime > STALE_LOCK_S):
            lock.unlink()
            warnings.warn(f"removed a build lock left by a build that did not finish: {lock}", stacklevel=4)
    except (ImportError, OSError):
        pass  # nothing to clear, or not ours to clear: torch reports what it must
