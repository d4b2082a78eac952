"""Weight-only quantization as a module swap: int8 and fp8 e4m3 per output channel, int4 with group-wise
scales (one scheme class per format: engine/quant/schemes.py).

    w ≈ scale * q                      int8: one scale per output row, q in [-127, 127]
    w ≈ scale * e4m3(q)                fp8-e4m3: one scale per output row, q an fp8 e4m3 value (|q| <= 448)
    w ≈ (q - 8) * scale + zero         int4: one (scale, zero) per group of input columns, q in [0, 15]

Activations stay in 16 bits. On the CPU the fast paths are the native weight-streaming kernels for
int8 (up to 8 rows; more rows: torch's `_weight_int8pack_mm`) and, for int4, the native kernel
(engine/kernels/stream_linear.cpp: half a byte per weight plus the group scales, read once per
call, for any number of rows; both want bf16 activations). Where the CPU multiplies bf16 natively, many rows
(prompt rows) take the library GEMM over the weight dequantized by the native kernels instead
(engine/quant/schemes.py gemm_for_many_rows). On CUDA, int4 runs through torch's packed
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

from engine.models.layers.linear import Linear, LinearWrapper
from engine.quant.embeddings import EMBED, HEAD, embedding_modules
from engine.quant.schemes import SCHEMES, pack_int4_chunks, unpack_int4_chunks  # noqa: F401 (re-exported)
from engine.quant_formats import quant_format

QUANTIZABLE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class QuantLinear(nn.Module):
    """A Linear whose weight is stored in a quantized format (engine/quant_formats.py: codes + scales), with
    optional 16-bit outlier columns.
    `stream`: the native weight-streaming module (set by set_stream_kernel), which int4 runs on."""

    stream = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, group_size: int,
                 outlier_idx: torch.Tensor | None = None, reference: bool = False, int4_layout: str = "auto") -> None:
        """`int4_layout`: "auto" packs int4 for torch's int4 matmul on CUDA where it applies, in the native
        kernel's tiles layout where its avx512 or avx2 tier runs, its chunk layout elsewhere; "torch", "tiles" and
        "chunks" force one (the tests)."""
        super().__init__()
        self.group_size, self.reference = group_size, reference
        if int4_layout not in ("auto", "torch", "tiles", "chunks"):
            raise ValueError(f"int4_layout: auto, torch, tiles or chunks, not {int4_layout!r}")
        self.int4_layout = int4_layout
        self.int4_tiles = False  # int4 in the native kernel's tiles layout (engine/quant/schemes.py)
        self.prompt_gemm = True  # many rows may take the dequantize-then-GEMM route (schemes.gemm_for_many_rows)
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
        self.format = quant_format(fmt)
        self.bits = self.format.bits  # bits per weight (memory figures)
        self.scheme = SCHEMES.get(self.format.name)  # engine/quant/schemes.py: storage and products
        if self.scheme is None:
            raise ValueError(f"QuantLinear takes a quantized format, got {self.format.name}")
        self.scheme.quantize(self, w)

    def dequantize(self) -> torch.Tensor:
        """The weight this module effectively multiplies by, (out, in), float32 (outliers included)."""
        w = self.scheme.dequantize(self)
        if self.outlier_idx is not None:
            w[:, self.outlier_idx] = self.outlier_w.float()
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reference or not self.scheme.fast_ok(self, x):
            return F.linear(x, self.dequantize().to(x.dtype), self.bias)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        y = self.scheme.matmul(self, x2)
        if self.outlier_idx is not None:
            y = y + x2.index_select(1, self.outlier_idx) @ self.outlier_w.t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def kernel_operands(self) -> tuple | str:
        """(kind, a, b, group) for the fused step's Proj (engine/runner/fused.py), or why not."""
        if self.reference:
            return "quantized layers in reference mode"
        if self.outlier_idx is not None:
            return "16-bit outlier columns"
        return self.scheme.kernel_operands(self)

    def nbytes(self) -> int:
        """Bytes held: quantized weights, scales, outlier columns, bias."""
        tensors = list(self.buffers()) + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def quantize_model(model: nn.Module, originals: dict[str, torch.Tensor], fmt: str, group_size: int,
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
    form = quant_format(fmt)
    new: dict[str, nn.Module] = {}
    for i, name in enumerate(names):
        mod = model.get_submodule(name)
        if isinstance(mod, LinearWrapper):  # a LoRA wrapper: the projection is its base
            mod = mod.base
        weight = originals[name] if device is None else originals[name].to(device)
        bias = mod.bias
        if form.dense:
            lin = Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            lin.weight = nn.Parameter(weight, requires_grad=False)
            lin.bias = bias
            new[name] = lin
        else:
            idx = outliers.get(name) if outliers else None
            if idx is not None:
                idx = idx.to(weight.device)
            new[name] = QuantLinear(weight, bias, form.name, group_size, idx, reference)
            del weight
        if install:
            swap_modules(model, {name: new[name]})
        if progress:
            progress(f"quantizing to {form.name}", (i + 1) / len(names))
    if EMBED in originals:
        tables = {k: originals[k] if device is None else originals[k].to(device) for k in (EMBED, HEAD)}
        table_modules = embedding_modules(model, tables, form.name, group_size, embeddings, QuantLinear, reference)
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
