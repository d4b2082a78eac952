"""Which dtype the engine stores and computes in, decided from what this CPU (or GPU) does fast.

bf16 storage halves the bytes a decode step reads, and the native decode kernels (fused step, weight
streaming, paged attention) take bf16 on every ISA tier, widening to fp32 in registers. torch's bf16
*matrix products* are another matter: they are fast only where the CPU has native bf16 dot products
(x86: avx512_bf16 or AMX; Arm: the bf16 feature, BFDOT/BFMMLA). Elsewhere they crawl, e.g. on a Zen 3
(AVX2) 0.27 GFLOP/s in bf16 against 53 in fp32 (issue 24: a ~400-token prompt 15.4 s to its first token
in bf16, 2.6 s in fp32). So "auto" keeps bf16 weights and the native decode path everywhere, and on a
CPU without native bf16 runs torch's multi-row products (prefill, chunked prefill, batched verify, the
eager attention) in fp32, widening each weight per call (engine/models/layers/linear.py).

Predicted cost of widening per call (arithmetic, not measured): 6 extra bytes moved per weight
(read 2, write 4) against 2 x rows FLOPs per weight; at 512 rows and ~50 GFLOP/s that is ~3 % of the
step, at 9 rows (a verify) it is most of it, still far below the bf16 crawl.

INFERLAB_EMULATED_BF16=1 forces the "no native bf16" decision on any CPU, so the fp32-compute path is
exercised (and compared) on a machine that has native bf16.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.kernels import cpu_flags, cpu_tier

EMULATED_BF16_ENV = "INFERLAB_EMULATED_BF16"
X86_NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags with bf16 dot products in hardware
ARM_NATIVE_BF16 = ("bf16",)  # /proc/cpuinfo "Features" on aarch64 (FEAT_BF16)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def native_bf16_flags(flags: Sequence[str]) -> list[str]:
    """The flags among `flags` that mean bf16 dot products in hardware (empty: bf16 is emulated)."""
    return [f for f in (*X86_NATIVE_BF16, *ARM_NATIVE_BF16) if f in flags]


def emulated_bf16_forced(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(EMULATED_BF16_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True, slots=True)
class ComputePlan:
    """dtype: the weights', KV cache's and activations' between layers. matmul_dtype: what torch's
    multi-row products compute in (a wider dtype: each weight is widened per call). reason: why."""

    dtype: torch.dtype
    matmul_dtype: torch.dtype
    reason: str

    @property
    def widened(self) -> bool:
        return self.matmul_dtype != self.dtype

    @property
    def what(self) -> str:
        """e.g. "bf16 weights, fp32 prefill", or "bf16"."""
        if self.widened:
            return f"{_SHORT[self.dtype]} weights, {_SHORT[self.matmul_dtype]} prefill"
        return _SHORT.get(self.dtype, str(self.dtype))

    def without_native_kernels(self) -> ComputePlan:
        """The plan where the native decode kernels cannot run (no compiler, not built yet, or
        stream_linear off): a widened plan becomes an fp32 model, since decode on torch's kernels would
        otherwise widen every weight per token (3x the bytes of an fp32 read); others stay as they are."""
        if not self.widened:
            return self
        return ComputePlan(self.matmul_dtype, self.matmul_dtype,
                           f"{self.reason}, and the native decode kernels are not available")

    def describe(self) -> str:
        """One line for the engine line and `generate --stats`, e.g. "bf16 weights, fp32 prefill: this
        CPU has no native bf16"."""
        return f"{self.what}: {self.reason}"


def plan_compute(name: str, device: torch.device, flags: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> ComputePlan:
    """The plan for EngineConfig.dtype `name` on `device`; `flags` (the CPU's, read when None) and
    `env` (os.environ when None) are parameters so tests can fake any CPU."""
    if name not in ("auto", *_DTYPES):
        raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {name!r}")
    if device.type == "cuda":
        return _gpu_plan(name, device)
    if device.type != "cpu":
        dtype = _DTYPES.get(name, torch.bfloat16)
        return ComputePlan(dtype, dtype, f"{'asked for' if name != 'auto' else 'default'} on {device.type}")
    flags = cpu_flags() if flags is None else flags
    native = native_bf16_flags(flags)
    forced = emulated_bf16_forced(env)
    if forced:
        why_not = f"{EMULATED_BF16_ENV}=1 (native bf16 ignored)"
    else:
        why_not = "this CPU has no native bf16 (no " + " / ".join(X86_NATIVE_BF16 + ARM_NATIVE_BF16) + ")"
    has_native = bool(native) and not forced
    if name == "auto":
        if has_native:
            return ComputePlan(torch.bfloat16, torch.bfloat16, f"this CPU has native bf16 ({', '.join(native)})")
        return ComputePlan(torch.bfloat16, torch.float32, why_not)
    dtype = _DTYPES[name]
    if dtype == torch.bfloat16 and not has_native:  # the user's choice stands; the line says what it costs
        return ComputePlan(dtype, dtype, f"asked for; {why_not}: prefill runs emulated bf16 (slow; --dtype auto "
                                         "computes it in fp32)")
    return ComputePlan(dtype, dtype, "asked for")


def _gpu_plan(name: str, device: torch.device) -> ComputePlan:
    """bf16 on GPUs of compute capability 8.0+ (Ampere on), where it is a native format; fp16 before."""
    if name != "auto":
        return ComputePlan(_DTYPES[name], _DTYPES[name], "asked for")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return ComputePlan(torch.float16, torch.float16,
                           f"GPU compute capability {major}.{minor} < 8.0 has no fast bf16")
    return ComputePlan(torch.bfloat16, torch.bfloat16,
                       f"GPU compute capability {major}.{minor} computes bf16 natively")


def compute_line(plan: ComputePlan, threads=None, short: bool = False, kernels: str | None = None,
                 tier: str | None = None) -> str:
    """The plan, the native kernels' tier where known, and the thread choice (on the CPU), in one line
    with the reasons; `short`: without them (a status bar), e.g. "bf16 weights, fp32 prefill · avx2 kernels ·
    1 thread" ("avx2 kernels building" while they build, torch's kernels meanwhile).
    `kernels`: the kernels' state in words (engine.kernels.status: building, unavailable and why); `tier`: the
    weights' kernel family's tier (default: the bf16 family's)."""
    tier = (tier or cpu_tier()) if threads is not None else None
    if short:
        state = ("" if not kernels else " building" if kernels.startswith("building")
                 else " unavailable" if kernels.startswith("unavailable") else "")
        parts = [plan.what, *([f"{tier} kernels{state}"] if tier else []),
                 *([threads.short()] if threads is not None else [])]
        return " · ".join(parts)
    parts = [plan.describe(), *([f"native kernels: {kernels or tier}"] if tier else []),
             *([threads.describe()] if threads is not None else [])]
    return "; ".join(parts)
