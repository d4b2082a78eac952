"""The attention backend, chosen once: the single source of truth for which path every layer takes.

EngineConfig.attention_backend names a wish; what runs also depends on the model, the device, the
dtype and whether compile is on. `select_backend` turns all of that into one frozen AttentionBackend
(engine/models/layers/attention.py) that the runner holds and hands to the layers in each step's
metadata. The runner selects it at start-up and again when compile switches (ModelRunner.set_execution).

- "reference": the readable path, nothing else (the tests hold every other path to it).
- "native": the C++ paged-decode kernel where it applies (bf16 on the CPU, head_dim 64/128, at most 8
  query heads per KV head; built once per machine and ISA tier, engine/kernels); the "fast" path for everything else.
- "compiled", or compile=True with any backend but reference: decode through the compiled
  gather-fused kernel (where the native kernel does not take the decode first).
- "flex": decodes and prefill chunks over a cached context through FlexAttention with a paged block
  mask (engine/models/layers/flex_paged.py), reading K/V in place; compiled on CUDA, eager on the CPU
  (where the tests hold it to the reference). Only when asked for: "native" on CUDA, where the C++
  kernel does not run, is "fast" (on the first GPU run the compiled FlexAttention had not finished
  compiling minutes into its first decode step).
- "triton", and "native" on CUDA: the CUDA path's Triton kernels (engine/kernels/gpu): paged decode and
  prefill attention reading K/V in place, RoPE fused with the KV write, add & norm, SwiGLU and sampling, so
  a decode step is a few kernels a layer and one CUDA graph serves every context length. On the CPU it runs
  only under Triton's interpreter (TRITON_INTERPRET=1: the tests); asked for where it cannot run, the
  "fast" path with one warning. Not with an 8-bit KV cache (the kernels read 16-bit caches), nor with
  compile=True (the compiled region is inductor's, its own Triton kernels on CUDA).
- "fast": batched paged attention in eager torch (decodes gather each context into a padded copy).
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import torch

from engine.events import AttentionBackendName as Name
from engine.kernels import gpu as gpu_kernels
from engine.kernels import native_decode_applies, paged_decode_kernel
from engine.models.layers import flex_paged
from engine.models.layers.attention import AttentionBackend, CompiledDecode, decode_attention_math
from engine.models.model_config import ModelConfig


@functools.cache
def _compiled_decode_attention():
    """One torch.compile wrapper per process: its compiled graphs are reused by every engine (and by
    a compile switched off and on again) instead of being compiled anew."""
    return torch.compile(decode_attention_math, dynamic=True)


def select_backend(name: Name, model_config: ModelConfig, device: torch.device, dtype: torch.dtype,
                   compile: bool, progress: Callable[[str, float], None] | None = None,
                   previous: AttentionBackend | None = None, wait: bool = True) -> AttentionBackend:
    """The backend for `name` (EngineConfig.attention_backend) on this model, device and dtype.
    `previous` (a re-selection): its compiled kernel is kept, so one that failed stays off (a previous
    of another kind, e.g. a bare runner's EAGER, has none to keep). `wait=False`: the native kernel only if
    it is built already (its build goes on in the background; engine/kernels)."""
    if name == Name.REFERENCE:
        return AttentionBackend(name, reference=True)
    if not compile and (name == Name.TRITON or (name == Name.NATIVE and device.type == "cuda")):
        triton = triton_kernels(device, warn=name == Name.TRITON)
        if triton is not None:
            return AttentionBackend(name, triton=triton)
    compiled = None
    if name == Name.COMPILED or compile:
        compiled = (previous.compiled_decode if previous is not None and previous.compiled_decode is not None
                    else CompiledDecode(_compiled_decode_attention()))
    native = None
    if name == Name.NATIVE and native_decode_applies(model_config, device, dtype):
        native = paged_decode_kernel(progress, wait=wait)  # None where it cannot be built (after one warning)
    flex = None
    # FlexAttention only when asked for: on the first GPU run (an H200, torch 2.11) its compile spent minutes in
    # inductor at the first decode step and never served one; "native" on CUDA is the batched eager path
    if name == Name.FLEX and flex_paged.available():
        flex = (previous.flex if previous is not None and previous.flex is not None
                else flex_paged.FlexPaged(compiled=device.type == "cuda"))
    return AttentionBackend(name, compiled_decode=compiled, native_decode=native, flex=flex)


def triton_kernels(device: torch.device, warn: bool):
    """The Triton kernels' module where they run on this device, else None (with one warning when they were
    asked for by name: the "fast" path serves instead)."""
    why = gpu_kernels.unavailable(device.type)
    if why is None:
        return gpu_kernels.load()
    if warn:
        warnings.warn(f"attention_backend 'triton' unavailable, using 'fast': {why}", stacklevel=3)
    return None


def for_model(backend: AttentionBackend, model_config: ModelConfig, device: torch.device,
              dtype: torch.dtype) -> AttentionBackend:
    """The same choice for another model on the same device (a draft model): the native kernel is kept
    only where it applies to that model's head shapes."""
    if backend.native_decode is not None and not native_decode_applies(model_config, device, dtype):
        return dataclasses.replace(backend, native_decode=None)
    return backend


def eager_backend(name: Name) -> AttentionBackend:
    """The backend's choice of layer path with no kernel (a throw-away runner, e.g. calibration)."""
    return AttentionBackend(name, reference=name == Name.REFERENCE)
