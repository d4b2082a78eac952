"""Optional quantization of the embedding table and the lm_head (`EngineConfig(quant_embeddings=True)`).

Both are quantized to int8 with one scale per row (per token), whatever the bits of the other layers:
a token's embedding is one row, so per-row scales keep every token's vector exact up to 1/254 of its
largest entry. With tied embeddings (SmolLM2) the table and the head share the same int8 bytes: the
lookup dequantizes the rows it gathers, the head multiplies them with the int8 kernel. An untied head
follows the other layers' bits (int4 with groups at 4 bits).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers.linear import Linear
from engine.quant_formats import quant_format

EMBED, HEAD = "embed_tokens", "lm_head"


def int8_rows(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (rows, cols) in [-127, 127], scale (rows,) in `dtype`) with w ≈ scale[:, None] * q."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.to(dtype)


class Int8Embedding(nn.Module):
    """An embedding table stored as int8 rows with one scale each; lookups return `dtype` vectors."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.dtype = scales.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.qweight).to(self.dtype) * self.scales[ids].unsqueeze(-1)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]


def embedding_modules(model: nn.Module, originals: dict[str, torch.Tensor], fmt: str, group_size: int,
                      quantize: bool, quant_linear: Callable[..., nn.Module],
                      reference: bool = False) -> dict[str, nn.Module]:
    """New embedding and head modules built from the original 16-bit tables: quantized when `quantize`
    and `fmt` names a quantized format, else the originals restored (tied again where the model ties them).
    `quant_linear`: the quantized head's class (weight_only.QuantLinear, handed in by the caller, so this
    module never imports weight_only, which imports it)."""
    tied = model.config.tie_word_embeddings
    emb_w = originals[EMBED]
    if not quantize or quant_format(fmt).dense:
        emb = nn.Embedding.from_pretrained(emb_w, freeze=True)
        head = Linear(emb_w.shape[1], emb_w.shape[0])
        head.weight = emb.weight if tied else nn.Parameter(originals[HEAD], requires_grad=False)
        return {EMBED: emb, HEAD: head}
    if tied:
        head = quant_linear(emb_w, None, "int8", group_size, reference=reference)
        embedding = Int8Embedding(head.qweight, head.scales)
    else:
        head = quant_linear(originals[HEAD], None, fmt, group_size, reference=reference)
        embedding = Int8Embedding(*int8_rows(emb_w, emb_w.dtype))
    head.prompt_gemm = False  # a prompt step asks it for one row per sequence: its own kernels (schemes.py)
    return {EMBED: embedding, HEAD: head}
