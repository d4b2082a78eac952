"""Native CPU kernels: one C++ module (module.cpp) built with torch.utils.cpp_extension once per machine and
ISA tier, like ggml's CPU variants. It holds:

- the weight-streaming products (stream_linear.cpp over core/linear.h): Linear layers for a few rows
  (decode) that read each weight once, from the one copy the engine keeps: bf16 rows, int8 rows, 4-bit
  codes with group scales, with float or int8 activations;
- the paged decode attention (paged_decode.cpp over core/attention.h): K and V streamed from the paged
  cache where they lie (EngineConfig.attention_backend "native");
- the fused decode step (fused_decode.cpp over core/ops.h): the whole transformer for 1..8 decode rows in
  one native call and one OpenMP parallel region (EngineConfig.fused_decode, engine/runner/fused.py);
- the sampler's rows (sample_rows.cpp over core/rows.h): each row's finiteness and its argmax, or its draw at
  its temperature, in one call (engine/models/layers/sampler.py, ModelRunner.rows_kernel).

Tiers (core/isa.h): "avx512" (AVX-512 with bf16 dot products and VNNI), "avx2" (AVX2 + FMA + F16C),
"neon" (AArch64, sdot where the CPU has it) and "portable" (plain C++). Each tier is its own build (its
compiler flags, its name), so the tests build and check every tier the test machine can run. Which one
runs is measured, per kernel family (bf16 rows, 4-bit rows, 8-bit rows, attention): at the first build
every tier this CPU runs is built and timed, and the fastest of each family is kept beside the builds
(tier_choice.py, read by tiers.py); `cpu_tier(family)` says it. INFERLAB_CPU_TIER=portable|avx2|avx512|neon forces one.

Where the compiler has no OpenMP (macOS's Apple clang) the kernels are built without it and split their
work over a small pool of their own threads (threads.h); INFERLAB_KERNELS_OPENMP=0 builds them so anywhere.
Where no C++ compiler is found (Windows without a toolchain) the build fails once, one line says so, and the
engine runs on torch's kernels. The first build takes ~25-60 s:
`build_in_background` starts it in a thread while the engine runs on torch's kernels (the app does this).

By concern: detect.py (what this CPU runs), build.py (compiling a tier, once per machine), load.py (loading
a build only where it is whole), tiers.py (which tier each family runs, in words), tier_choice.py (timing
the tiers); this module hands the engine its modules (built once per process, in the background on request).
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future

from engine.kernels import build, load, tiers
from engine.kernels import tier_choice as _tier_choice
from engine.kernels.build import OPENMP_ENV
from engine.kernels.detect import TIERS, cpu_flags, supported_tiers, unconfirmed_flags
from engine.kernels.tiers import (
    choice_summary,
    cpu_tier,
    describe_choice,
    describe_tier,
    forced_tier,
    measured_choice,
    timed_tiers,
)

__all__ = ["OPENMP_ENV", "TIERS", "build_in_background", "build_pending", "built_with_openmp", "choice_pending",
           "choice_summary", "choose_tiers", "cpu_flags", "cpu_tier", "describe_choice", "describe_tier",
           "forced_tier", "fused_decode_kernel", "kernel_module", "measured_choice", "native_decode_applies",
           "paged_decode_kernel", "status", "stream_linear_kernel", "supported_tiers", "timed_tiers",
           "unconfirmed_flags"]

_BUILT: dict[str, object] = {}  # build name -> the loaded module, or None after a failed build
_PENDING: dict[str, Future] = {}  # build name -> its background build
_LOCK = threading.Lock()  # one build at a time in this process (background thread and callers)
_PENDING_LOCK = threading.Lock()  # _PENDING only: never held during a build, so asking never waits on one
_CHOICE_KEY = "tier-choice"  # _PENDING's key for the tiers' timing in the background (choose_tiers)


def choice_pending() -> bool:
    """Whether the tiers are being built and timed in the background right now."""
    future = _PENDING.get(_CHOICE_KEY)
    return future is not None and not future.done()


def choose_tiers(progress: Callable[[str, float], None] | None = None):
    """Build every tier timed_tiers names and time them (tier_choice.py), once per machine and build; the
    choice, or None where fewer than two tiers build (then each family runs the best that did)."""
    timed = timed_tiers()
    if forced_tier() is not None or len(timed) < 2:
        return None
    stored = measured_choice()
    if stored is not None:
        return stored
    if progress is not None:
        progress(f"building the native kernels for {', '.join(timed)} to time them (once per machine)", 0.95)
    modules = {t: m for t in timed if (m := _build(build.build_name(t), t, None)) is not None}
    if len(modules) < 2:
        return None
    builds = [build.build_name(t) for t in timed]
    choice = _tier_choice.make_choice(tiers.choice_path(builds), builds, modules)
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
            for future in [build_in_background(t) for t in timed_tiers()]:
                future.result()
            return choose_tiers()
        except Exception as exc:  # noqa: BLE001 (a failed timing: the best tier runs; say why)
            warnings.warn(f"native kernels: timing the tiers failed ({build.first_line(exc)}); the best tier runs",
                          stacklevel=2)
            return None

    return _in_background(_CHOICE_KEY, work, "inferlab-kernels-choice")


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
    name = build.build_name(tier)
    if name in _BUILT:
        return _BUILT[name]
    if not wait:
        built = load.import_built(name)
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
    name = build.build_name(tier)
    return _in_background(name, lambda: _build(name, tier, None), f"inferlab-kernels-{tier}")


def build_pending(tier: str | None = None) -> bool:
    """Whether `tier`'s module (default: the engine's) is being built in the background right now, or the
    tiers are being built and timed (which builds it too)."""
    if choice_pending():
        return True
    future = _PENDING.get(build.build_name(tier or cpu_tier()))
    return future is not None and not future.done()


def status(tier: str | None = None, family: str | None = None) -> str:
    """The kernels in words for the engine line: "avx512 (…), timed fastest for bf16 within 5 % (avx2 1.31x its
    time)", "building avx2 (…)" or why not."""
    if tier is None and choice_pending():
        return (f"building and timing {', '.join(timed_tiers())} in the background (once per machine); "
                "torch's kernels meanwhile")
    tier = tier or cpu_tier(family)
    name = build.build_name(tier)
    if build_pending(tier):
        return f"building {describe_tier(tier)} in the background; torch's kernels meanwhile"
    if name in _BUILT and _BUILT[name] is None:
        return f"unavailable ({build.FAILED.get(name, 'no C++ compiler')}); torch's kernels"
    if name in _BUILT and not built_with_openmp(_BUILT[name]):
        return f"{describe_choice(family)}, built without OpenMP: their own thread pool"
    return describe_choice(family)


def built_with_openmp(module) -> bool:
    """Whether a built module splits its work over OpenMP's threads (else over its own pool, threads.h)."""
    return bool(module.openmp()) if hasattr(module, "openmp") else True


def _build(name: str, tier: str, progress: Callable[[str, float], None] | None):
    """Build (once per machine) or load the module; None after a failed build (one warning, one line)."""
    with _LOCK:
        if name in _BUILT:
            return _BUILT[name]
        if progress is not None:
            progress(f"loading the native kernels ({tier})" if load.is_built(name)
                     else f"building the native kernels for {describe_tier(tier)} (once per machine, ~25-60 s)", 0.95)
        built = load.import_built(name)
        without = build.build_name(tier, openmp=False)
        if built is None and without != name:
            built = load.import_built(without)  # this machine's compiler had no OpenMP before: its build
        if built is None:
            built = build.compile_build(name, tier)
        _tier_choice.apply_bodies(measured_choice(), tier, built)
        _BUILT[name] = built
        return built
