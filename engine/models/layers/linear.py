"""Linear layers. Quantized variants (engine/quant/weight_only.py) replace these by module swap.

Each Linear keeps ONE copy of its weight, (out, in) as the checkpoint stores it. On the CPU in bf16,
up to STREAM_MAX_ROWS rows (decode) go through the native weight-streaming kernel
(engine/kernels/stream_linear.cpp, `stream`, set by `set_stream_kernel`), which reads that copy
once per call; more rows (prefill) go through the library's GEMM on the same copy.

EngineConfig.pack_weights (off by default) additionally keeps oneDNN's blocked layout ("packed",
`pack_linears`) for the library GEMM: ~15 % faster at 47 rows, ~5 % at 256 (measured on the 2-core
test machine, SmolLM2-135M shapes), at the price of a second copy of every weight (counted in the
engine's weights bytes).

`matmul_dtype`, when set (`set_matmul_dtype`: fp32 on a CPU without native bf16 dot products,
engine/runner/cpu_compute.py), is what the library path computes in: the bf16 weight is widened per
call (no second copy kept) and the result rounded back, so activations between layers stay bf16.
"""
from __future__ import annotations

import functools
import weakref
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers.gemv import gemv_math, wants_gemv

# Packed weights by the address of the weight they copy. Compiled regions cannot hold oneDNN's opaque
# tensors, so they call the op below with the plain weight (a graph input like any parameter, so the
# 30 layers share one compiled graph); the op looks its packed copy up when it runs.
_PACKED: dict[int, torch.Tensor] = {}


@torch.library.custom_op("inferlab::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T through the packed copy of `weight` (x 2-D bf16)."""
    return torch.ops.mkldnn._linear_pointwise(x, _PACKED[weight.data_ptr()], None, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


STREAM_MAX_ROWS = 8  # up to this many rows the weight-streaming kernel beats the library GEMM
# Where bf16 is emulated (matmul_dtype fp32), a library product widens the whole weight to fp32 first: a
# decode batch of up to this many rows goes through the streaming kernel in one call instead (8 rows a pass
# over blocks of the weight that stay in cache; 16 LoRA decodes as AVX2: 335 ms a step widened, 155 ms in
# chunks of 8)
STREAM_CHUNKED_MAX_ROWS = 4 * STREAM_MAX_ROWS


# The native module the last set_stream_kernel gave the layers: what the ops below call (a compiled step
# calls them ~120 times; looking the module up costs ~4 us a call). None: looked up on first use.
_STREAM_MODULE = None


def _stream_module():
    global _STREAM_MODULE
    if _STREAM_MODULE is None:
        from engine.kernels import stream_linear_kernel

        _STREAM_MODULE = stream_linear_kernel()
    return _STREAM_MODULE


# The native kernel as an op a compiled region calls without a graph break (x 2-D bf16). Registered with the
# plain library API, not torch.library.custom_op: a compiled decode step calls it ~120 times, and the
# custom_op wrapper cost ~6 us a call more here (22 vs 28-32 us for a 4 x 576 x 576 product).
_OPS = torch.library.Library("inferlab", "FRAGMENT")
_OPS.define("stream_linear_bf16(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_OPS.impl("stream_linear_bf16", lambda x, weight, bias: _stream_module().stream_linear_bf16(x, weight, bias), "CPU")


@torch.library.register_fake("inferlab::stream_linear_bf16")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


stream_linear_bf16 = torch.ops.inferlab.stream_linear_bf16.default


# True while a forward pass carries prompt rows (the runner sets it): they take the library GEMM however
# few they are. The few-row kernels round differently from the GEMM, so a prompt's last 4 tokens after a
# prefix-cache hit (or a short last chunk) would get other K/V than in a full prefill, and a greedy answer
# could change on its second run. The GEMM gives each row the same result whatever the row count. A
# ContextVar, not a flag on the layers: it belongs to one forward pass in one thread (two engines may step
# in two threads), and flipping module attributes would make torch.compile recompile.
PROMPT_ROWS: ContextVar[bool] = ContextVar("inferlab_prompt_rows", default=False)

# True while a forward pass runs with EngineConfig.int8_activations (the runner sets it, as PROMPT_ROWS): a
# 4- or 8-bit layer's many rows then take its int8-activation kernel where no native bf16 GEMM applies
# (engine/quant/schemes.py), as its decode rows do in the fused step.
INT8_ROWS: ContextVar[bool] = ContextVar("inferlab_int8_rows", default=False)


def few_rows(x: torch.Tensor) -> bool:
    """Up to STREAM_MAX_ROWS rows that are not prompt rows (PROMPT_ROWS; inside a compiled region the
    row count alone decides: the ContextVar is not traced, and steps with prompt rows run eager,
    LlamaForCausalLM.forward)."""
    return x.shape[0] <= STREAM_MAX_ROWS and (torch.compiler.is_compiling() or not PROMPT_ROWS.get())


def wants_stream(x: torch.Tensor) -> bool:
    """A few bf16 rows on the CPU, not for autograd (training LoRA adapters takes the library path)."""
    return (x.dim() == 2 and few_rows(x) and x.dtype == torch.bfloat16 and x.device.type == "cpu"
            and not x.requires_grad)


# Where bf16 is emulated (matmul widened), the kernels' tiers whose weight-streaming kernel takes prompt rows
# too, and any number of rows, in one call instead of the widened library GEMM. Each row's result there is its
# result alone whatever rows share the call (core/linear.h), so a prompt's K/V do not depend on its chunking or on a
# prefix-cache hit, the reason prompt rows otherwise keep to the GEMM (PROMPT_ROWS). On the AVX2 body,
# SmolLM2-135M as AVX2 on a Zen 4, 1 thread, one prompt to its first token, alternating with the widened GEMM
# (widening every weight per call cost ~75 ms): 8 tokens 0.39-0.48x the time, 32 tokens 0.68-0.71x, 128
# tokens 0.98-0.99x, 400 tokens 1.06x (at 2 threads 0.40x to 0.98x). Not measured on the NEON body, which
# keeps the GEMM.
PROMPT_STREAM_TIERS = ("avx2",)


def wants_stream_instead_of_widening(x: torch.Tensor, stream) -> bool:
    """Where bf16 is emulated: bf16 rows past one streaming pass that the streaming module takes instead of a
    widened GEMM: a decode batch of up to STREAM_CHUNKED_MAX_ROWS rows (not prompt rows, which take the GEMM),
    or on the tiers of PROMPT_STREAM_TIERS rows of any kind and number."""
    if not (x.dim() == 2 and x.dtype == torch.bfloat16 and x.device.type == "cpu" and not x.requires_grad):
        return False
    return (x.shape[0] <= STREAM_CHUNKED_MAX_ROWS and not PROMPT_ROWS.get()) or stream.tier() in PROMPT_STREAM_TIERS


def eager_library_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         matmul_dtype: torch.dtype | None, stream) -> torch.Tensor:
    """What a Linear computes for rows past the streaming and single-row kernels: widened to
    `matmul_dtype` (or through `stream`, the native module, where that reads the weight fewer times), else
    the library's product in x's dtype."""
    if matmul_dtype is not None and x.dtype != matmul_dtype:
        if stream is not None and weight.dtype == torch.bfloat16 and wants_stream_instead_of_widening(x, stream):
            return stream.stream_linear_bf16(x, weight, bias)  # 8 rows a pass over each block of the weight
        return widened_linear(x, weight, bias, matmul_dtype)
    return F.linear(x, weight, bias)


@torch.library.custom_op("inferlab::library_linear", mutates_args=())
def library_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   matmul_dtype: torch.dtype | None, chunked: bool) -> torch.Tensor:
    """eager_library_linear as one opaque call in a compiled region (`chunked`: the Linear has the native
    module). Traced instead, inductor folded the product and the next residual add into one addmm,
    rounded once to bf16 where eager rounds twice: a compiled step's answers parted from eager's."""
    return eager_library_linear(x, weight, bias, matmul_dtype, _stream_module() if chunked else None)


@library_linear.register_fake
def _(x, weight, bias, matmul_dtype, chunked):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _forget(key: int, packed: torch.Tensor) -> None:
    if _PACKED.get(key) is packed:  # not a newer weight's copy at a reused address
        del _PACKED[key]


def packing_available(weight: torch.Tensor) -> bool:
    """bf16 weights on a CPU torch built with oneDNN (mkldnn), where oneDNN packs bf16 on this CPU: it
    needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, and refuses (a RuntimeError) on AVX2-only CPUs."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and onednn_packs_bf16())


@functools.cache
def onednn_packs_bf16() -> bool:
    """Whether oneDNN takes bf16 weights on this CPU (what torch asks before its own bf16 oneDNN paths)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return False


class Linear(nn.Module):
    """y = x W^T + b, weights stored (out_features, in_features) like Hugging Face checkpoints.
    `stream`, when set (`set_stream_kernel`), is the native module that computes a few bf16 rows on the
    CPU straight from the weight. `gemv`, when set (EngineConfig.compile) and there is no native kernel,
    computes single 16-bit rows through a compiled reduction: see engine/models/layers/gemv.py.
    `packed`, when set (`pack`), is the weight in oneDNN's layout, used for the other 2-D bf16 inputs
    (inside compiled regions through the `inferlab::packed_linear` op)."""

    gemv = None
    packed = None
    stream = None
    matmul_dtype: torch.dtype | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def pack(self) -> None:
        """Keep (or refresh) the oneDNN-packed copy of the weight, where packing applies."""
        self.unpack()
        w = self.weight.detach()
        if packing_available(w):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w)
            _PACKED[w.data_ptr()] = self.packed
            self._finalizer = weakref.finalize(self, _forget, w.data_ptr(), self.packed)

    def unpack(self) -> None:
        if self.packed is not None:
            self._finalizer()  # forgets the registry entry; the copy goes with the last reference
            self.packed = None

    def packed_bytes(self) -> int:
        return 0 if self.packed is None else self.packed.numel() * self.packed.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stream is not None and self.weight.dtype == torch.bfloat16 and wants_stream(x):
            if torch.compiler.is_compiling():
                return stream_linear_bf16(x, self.weight, self.bias)
            return self.stream.stream_linear_bf16(x, self.weight, self.bias)
        if self.gemv is not None and wants_gemv(x) and few_rows(x):
            # One row, compile=True. Streaming every weight from memory once per token, the compiled
            # reduction beats even the packed kernel (one stream: 58-63 vs 42-44 tokens/s, bench decode).
            # Inside a compiled region the math is traced into the region's own graph.
            y = gemv_math(x, self.weight) if torch.compiler.is_compiling() else self.gemv(x, self.weight)
            return y if self.bias is None else y + self.bias
        widened = self.matmul_dtype is not None and x.dtype != self.matmul_dtype  # then the packed copy is unused
        if (self.packed is not None and not widened and x.dim() == 2 and x.dtype == torch.bfloat16
                and not x.requires_grad):
            if torch.compiler.is_compiling():  # an opaque call in the compiled graph; the bias add fuses
                y = packed_linear(x, self.weight)
                return y if self.bias is None else y + self.bias
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if torch.compiler.is_compiling():  # rounded as eager rounds it (see library_linear)
            return library_linear(x, self.weight, self.bias, self.matmul_dtype, self.stream is not None)
        return eager_library_linear(x, self.weight, self.bias, self.matmul_dtype, self.stream)


def pack_linears(model: nn.Module, on: bool = True) -> int:
    """Pack (on) or drop the packed copies of every Linear of `model` that lacks (has) one; returns the
    bytes the packed copies hold."""
    total = 0
    for m in model.modules():
        if isinstance(m, Linear):
            if not on:
                m.unpack()
            elif m.packed is None:
                m.pack()
            total += m.packed_bytes()
    return total


def set_stream_kernel(model: nn.Module, kernel) -> None:
    """Give every layer with a `stream` slot (Linear, the quantized layers) the native weight-streaming
    module, or None (the library's kernels)."""
    global _STREAM_MODULE
    if kernel is not None:
        _STREAM_MODULE = kernel
    for m in model.modules():
        if hasattr(type(m), "stream"):
            m.stream = kernel


def set_matmul_dtype(model: nn.Module, dtype: torch.dtype | None) -> None:
    """Give every layer with a `matmul_dtype` slot the dtype its library products compute in (None:
    the input's own)."""
    for m in model.modules():
        if hasattr(type(m), "matmul_dtype"):
            m.matmul_dtype = dtype


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """x W^T + b computed in `dtype` (a CPU's fast fp32 GEMM instead of its emulated bf16 one), returned
    in x's dtype. The weight is widened for this call only: memory stays one bf16 copy."""
    y = F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return y.to(x.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, with gate and up side by side in the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class LinearWrapper(nn.Module):
    """A module that adds to what an inner projection (`base`: a Linear or a quantized one) computes,
    such as a LoRA update (engine/lora/layer.py). A requantization replaces `base` and keeps the wrapper
    (engine/quant/weight_only.swap_modules)."""

    base: nn.Module
