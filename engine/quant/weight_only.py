"""Weight-only quantization as a module swap: int8 per output channel, int4 with group-wise scales.

    w ≈ scale * q                      int8: one scale per output row, q in [-127, 127]
    w ≈ (q - 8) * scale + zero         int4: one (scale, zero) per group of input columns, q in [0, 15]

Activations stay in 16 bits. On the CPU the fast paths are the native weight-streaming kernels for
int8 (up to 8 rows; more rows: torch's `_weight_int8pack_mm`) and, for int4, the native kernel
(engine/kernels/stream_linear.cpp: half a byte per weight plus the group scales, read once per
call, for any number of rows; both want bf16 activations). On CUDA, int4 runs through torch's packed
int4 matmul (`_weight_int4pack_mm`, engine/quant/int4_torch.py; bf16, compute capability 8.0+), its
layout packed once when the layer is built; int8 through torch's fused `_weight_int8pack_mm` for a
few rows (decode), and for more rows (prefill) the weight cast to 16 bits once per call, which a GEMM
over many rows amortizes. Each layer keeps one copy of its codes, in the layout its kernel reads.
Everywhere else, and as the reference the tests hold them to, the weight is dequantized and multiplied.
None of the CUDA paths has run on a GPU yet; their CPU twins are tested (tests/test_quant_torch_int4.py).

Outliers (LLM.int8 style): the few input channels with the largest activation x weight magnitude are
kept out of the quantized matrix and multiplied in 16 bits, so one huge value no longer stretches the
scale of everything it shares a row or group with.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers.linear import Linear, LinearWrapper, few_rows
from engine.quant import int4_torch
from engine.quant.embeddings import EMBED, HEAD, embedding_modules, int8_rows
from engine.quant_formats import quant_format

QUANTIZABLE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@torch.library.custom_op("inferlab::stream_linear_int4", mutates_args=())
def stream_linear_int4(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor,
                       group_size: int) -> torch.Tensor:
    """The native int4 kernel as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int4(x, codes, scale_zero, group_size, None)


@stream_linear_int4.register_fake
def _(x: torch.Tensor, codes: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0])


@torch.library.custom_op("inferlab::stream_linear_int8", mutates_args=())
def stream_linear_int8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The native int8 row kernel as an op a compiled region calls without a graph break."""
    from engine.kernels import stream_linear_kernel

    return stream_linear_kernel().stream_linear_int8(x, qweight, scales, None)


@stream_linear_int8.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], qweight.shape[0])


def pack_int4_chunks(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes (out, in), values 0..15 -> (out, in / 2) uint8 in the kernel's layout: per chunk of
    32 columns, byte j holds column j (low nibble) and column j + 16 (high nibble)."""
    n, k = q.shape
    chunks = q.to(torch.uint8).reshape(n, k // 32, 2, 16)
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4_chunks(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4_chunks: (out, in / 2) uint8 -> (out, in) int64 codes."""
    n, half = codes.shape
    c = codes.reshape(n, half // 16, 1, 16).long()
    return torch.cat([c & 0xF, c >> 4], dim=2).reshape(n, 2 * half)


class QuantLinear(nn.Module):
    """A Linear whose weight is stored in 8 or 4 bits (+ scales), with optional 16-bit outlier columns.
    `stream`: the native weight-streaming module (set by set_stream_kernel), which int4 runs on."""

    stream = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int, group_size: int,
                 outlier_idx: torch.Tensor | None = None, reference: bool = False, int4_layout: str = "auto") -> None:
        """`int4_layout`: "auto" packs int4 for torch's int4 matmul on CUDA where it applies and keeps the
        native kernel's layout elsewhere; "torch" packs for torch's matmul on the CPU too (its tests)."""
        super().__init__()
        self.bits, self.group_size, self.reference = bits, group_size, reference
        self.int4_layout = int4_layout
        self.register_buffer("packed", None)  # torch's packed int4 layout, when the layer uses it (then no codes)
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        w = weight.float()
        if outlier_idx is not None and outlier_idx.numel():
            self.register_buffer("outlier_idx", outlier_idx)
            self.register_buffer("outlier_w", weight[:, outlier_idx].clone())  # (out, n_outliers), 16 bits
            w = w.clone()
            w[:, outlier_idx] = 0.0
        else:
            self.outlier_idx = None
        self.bias = bias
        self.format = quant_format(bits)
        quantize = {"int8": self._quantize_int8, "int4": self._quantize_int4}.get(self.format.name)
        if quantize is None:
            raise ValueError(f"QuantLinear takes a quantized format, got {self.format.name}")
        quantize(w)

    def _quantize_int8(self, w: torch.Tensor) -> None:
        q, scale = int8_rows(w, self.dtype)  # one scale per output row
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scale)
        # torch's fused int8 kernel where this torch build has it for the device (older CUDA builds lack it)
        self.int8_fused = w.device.type == "cuda" and _int8_mm_runs(w.device, self.dtype)

    def _quantize_int4(self, w: torch.Tensor) -> None:
        g = self.group_size
        if self.in_features % g:
            raise ValueError(f"in_features {self.in_features} is not a multiple of the group size {g}")
        wg = w.reshape(self.out_features, -1, g)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-8) / 15.0
        zero = lo + 8 * scale  # so that w = (q - 8) * scale + zero
        q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(self.out_features, -1)
        # (out, groups, 2) scale-and-zero per group: what the native kernel reads next to each row
        scale_zero = torch.cat([scale, zero], dim=-1).to(self.dtype).contiguous()
        if self._torch_int4(w.device):  # the kernel's (groups, out, 2) pairs and its packing, made once
            packed = int4_torch.checked_pack(q, scale_zero, self.group_size)
            if packed is not None:
                self.register_buffer("szt", packed[1])
                self.register_buffer("packed", packed[0])
                return
        self.register_buffer("scale_zero", scale_zero)
        # two 4-bit codes per byte, the one copy both the kernel and the dequantize path read
        self.register_buffer("codes", pack_int4_chunks(q))

    def _torch_int4(self, device: torch.device) -> bool:
        wanted = self.int4_layout == "torch" or (self.int4_layout == "auto" and device.type == "cuda")
        return (wanted and not self.reference
                and int4_torch.applies(device, self.dtype, self.out_features, self.in_features, self.group_size))

    def dequantize(self) -> torch.Tensor:
        """The weight this module effectively multiplies by, (out, in), float32 (outliers included)."""
        if self.bits == 8:
            w = self.qweight.float() * self.scales.float()[:, None]
        elif self.packed is not None:
            w = int4_torch.dequantize(self.packed, self.group_size, self.szt, self.in_features)
        else:
            q = unpack_int4_chunks(self.codes)
            sz = self.scale_zero.float()  # (out, groups, 2)
            q = q.float().reshape(self.out_features, -1, self.group_size)
            w = ((q - 8) * sz[..., :1] + sz[..., 1:]).reshape(self.out_features, self.in_features)
        if self.outlier_idx is not None:
            w[:, self.outlier_idx] = self.outlier_w.float()
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reference or not self._fast_ok(x):
            return F.linear(x, self.dequantize().to(x.dtype), self.bias)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        few = few_rows(x2)  # a few decode rows (prompt rows take the many-row kernel: linear.PROMPT_ROWS)
        if self.packed is not None:
            y = int4_torch.matmul(x2, self.packed, self.group_size, self.szt)
        elif self.bits == 8 and self.int8_fused and few and self.scales.dtype == x2.dtype:
            y = torch._weight_int8pack_mm(x2, self.qweight, self.scales)  # fused: the int8 weight read once
        elif self.bits == 8 and x.device.type == "cuda":  # many rows: one 16-bit cast per call, then a GEMM
            y = F.linear(x2, self.qweight.to(x2.dtype)) * self.scales.to(x2.dtype)
        elif self.bits == 8 and self.stream is not None and few and self.scales.dtype == x2.dtype:
            if torch.compiler.is_compiling():
                y = stream_linear_int8(x2, self.qweight, self.scales)
            else:
                y = self.stream.stream_linear_int8(x2, self.qweight, self.scales, None)
        elif self.bits == 8:  # more rows: torch's kernel (it reuses each weight row across them)
            y = torch._weight_int8pack_mm(x2, self.qweight, self.scales)
        elif torch.compiler.is_compiling():
            y = stream_linear_int4(x2, self.codes, self.scale_zero, self.group_size)
        else:
            y = self.stream.stream_linear_int4(x2, self.codes, self.scale_zero, self.group_size, None)
        if self.outlier_idx is not None:
            y = y + x2.index_select(1, self.outlier_idx) @ self.outlier_w.t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def _fast_ok(self, x: torch.Tensor) -> bool:
        if self.packed is not None:  # torch's int4 matmul takes bf16 activations
            return x.dtype == torch.bfloat16
        if x.device.type == "cuda":  # int8 in any 16-bit dtype; int4 not packed for torch (fp16, old GPUs)
            return x.dtype in (torch.bfloat16, torch.float16) and self.bits == 8
        if x.device.type != "cpu" or x.dtype != torch.bfloat16:
            return False
        return self.bits == 8 or (self.stream is not None and self.in_features % 64 == 0)

    def nbytes(self) -> int:
        """Bytes held: quantized weights, scales, outlier columns, bias."""
        tensors = list(self.buffers()) + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def _int8_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `_weight_int8pack_mm` runs on `device` for `dtype` activations (one tiny product)."""
    try:
        x = torch.zeros(1, 32, dtype=dtype, device=device)
        torch._weight_int8pack_mm(x, torch.zeros(8, 32, dtype=torch.int8, device=device),
                                  torch.ones(8, dtype=dtype, device=device))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def quantize_model(model: nn.Module, originals: dict[str, torch.Tensor], bits: int, group_size: int,
                   outliers: dict[str, torch.Tensor] | None = None, reference: bool = False,
                   progress=None, embeddings: bool = False, device: torch.device | None = None,
                   install: bool = False, names: list[str] | None = None) -> dict[str, nn.Module]:
    """New modules for every quantizable Linear (and the embedding table and lm_head, quantized when
    `embeddings`), built from the ORIGINAL 16-bit weights in `originals` (never from already quantized
    ones). Returns {module name: module}; `swap_modules` installs them.

    Layer by layer: each original goes to `device` (default: where it is) only while its module is
    built, so a GPU never holds more than one extra 16-bit layer (the originals stay on the host).
    `install`: swap each new module in as soon as it is built, so the layer it replaces is freed before
    the next is made (start-up; a requantization at run time builds aside while the old layers serve).
    `names`: only these layers (engine/quant/at_load.py: one decoder layer as it is loaded)."""
    names = names or [n for n, m in model.named_modules() if n.split(".")[-1] in QUANTIZABLE]
    fmt = quant_format(bits)
    new: dict[str, nn.Module] = {}
    for i, name in enumerate(names):
        mod = model.get_submodule(name)
        if isinstance(mod, LinearWrapper):  # a LoRA wrapper: the projection is its base
            mod = mod.base
        weight = originals[name] if device is None else originals[name].to(device)
        bias = mod.bias
        if fmt.dense:
            lin = Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            lin.weight = nn.Parameter(weight, requires_grad=False)
            lin.bias = bias
            new[name] = lin
        else:
            idx = outliers.get(name) if outliers else None
            if idx is not None:
                idx = idx.to(weight.device)
            new[name] = QuantLinear(weight, bias, bits, group_size, idx, reference)
            del weight
        if install:
            swap_modules(model, {name: new[name]})
        if progress:
            progress(f"quantizing to {bits} bits", (i + 1) / len(names))
    if EMBED in originals:
        tables = {k: originals[k] if device is None else originals[k].to(device) for k in (EMBED, HEAD)}
        table_modules = embedding_modules(model, tables, bits, group_size, embeddings, QuantLinear, reference)
        if install:
            swap_modules(model, table_modules)
        new.update(table_modules)
    return new


def swap_modules(model: nn.Module, modules: dict[str, nn.Module]) -> None:
    for name, mod in modules.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if isinstance(getattr(parent, child), LinearWrapper):  # a LoRA wrapper stays; its base changes
            getattr(parent, child).base = mod
        else:
            setattr(parent, child, mod)


def original_weights(model: nn.Module, skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """The 16-bit weights of every quantizable Linear (less those in `skip`, quantized while loading),
    the embedding table and the lm_head, kept so that requantizing starts from them."""
    out = {n: m.weight.detach() for n, m in model.named_modules()
           if n.split(".")[-1] in QUANTIZABLE and n not in skip}
    out[EMBED] = model.get_submodule(EMBED).weight.detach()
    out[HEAD] = model.get_submodule(HEAD).weight.detach()
    return out


def outlier_channels(act_absmax: dict[str, torch.Tensor], originals: dict[str, torch.Tensor],
                     count: int) -> dict[str, torch.Tensor]:
    """Per layer, the `count` input channels with the largest activation x weight magnitude."""
    out = {}
    for name, w in originals.items():
        if name.split(".")[-1] not in QUANTIZABLE:
            continue
        score = w.float().abs().amax(dim=0)
        if name in act_absmax:
            score = score * act_absmax[name].float()
        out[name] = score.topk(min(count, score.numel())).indices.sort().values
    return out


def weight_error_report(originals: dict[str, torch.Tensor], modules: dict[str, nn.Module]) -> dict[str, float]:
    """Relative Frobenius error ||W - deq(Wq)|| / ||W|| per quantized layer (the GUI's heatmap)."""
    report = {}
    for name, mod in modules.items():
        if hasattr(mod, "dequantize"):
            deq = mod.dequantize()  # on the module's device; the original (on the host) joins it there
            w = originals[name].to(deq.device).float()
            report[name] = float((w - deq).norm() / w.norm().clamp(min=1e-12))
    return report
