"""int4 through torch's packed int4 matmul (tinygemm): `aten._weight_int4pack_mm` on CUDA (compute
capability 8.0+, bf16 activations), `aten._weight_int4pack_mm_for_cpu` on the CPU (the same layout
contract, what the tests run here).

Its dequantization rule is QuantLinear's own: w = (q - 8) * scale + zero per group of input columns, so
the codes and (scale, zero) pairs go in as they are; the packing is done once, when the layer is built,
checked with one product against that rule (a torch whose layout differs leaves the layer on the
native layout, with a warning), and the packed tensor is the layer's only copy of its codes.
"""
from __future__ import annotations

import torch

GROUP_SIZES = (32, 64, 128, 256)
INNER_K_TILES = (8, 4, 2)  # the kernel's tiling of k: a multiple of 16 * tiles columns


def inner_k_tiles(in_features: int) -> int | None:
    return next((t for t in INNER_K_TILES if in_features % (16 * t) == 0), None)


def applies(device: torch.device, dtype: torch.dtype, out_features: int, in_features: int, group_size: int) -> bool:
    """Whether torch's packed int4 matmul takes a layer of this shape on this device."""
    if dtype != torch.bfloat16 or group_size not in GROUP_SIZES or inner_k_tiles(in_features) is None:
        return False
    if device.type == "cuda":
        return out_features % 8 == 0 and torch.cuda.get_device_capability(device)[0] >= 8
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def pack(q: torch.Tensor) -> torch.Tensor:
    """Codes (out, in), values 0..15, on their device -> torch's packed int4 layout for that device."""
    tiles = inner_k_tiles(q.shape[1])
    if q.device.type == "cuda":  # two codes a byte, the even column in the high nibble
        q8 = (q[:, ::2].to(torch.uint8) << 4) | q[:, 1::2].to(torch.uint8)
        return torch.ops.aten._convert_weight_to_int4pack(q8.contiguous(), tiles)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), tiles)


def checked_pack(q: torch.Tensor, scale_zero: torch.Tensor,
                 group_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed codes, the kernel's scale-and-zero pairs), after one product through the kernel agreed with
    the readable rule on a random row; None, with a warning, where packing failed or they disagree (a
    torch whose layout differs from the one assumed here: the layer then keeps the native layout)."""
    import warnings

    try:
        packed, szt = pack(q), scales_and_zeros(scale_zero)
        out_features, in_features = q.shape
        sz = scale_zero.float()  # (out, groups, 2)
        w = ((q.float().reshape(out_features, -1, group_size) - 8) * sz[..., :1] + sz[..., 1:]).reshape(q.shape)
        x = torch.randn(1, in_features, device=q.device).to(torch.bfloat16)
        got, want = matmul(x, packed, group_size, szt).float(), x.float() @ w.t()
        if (got - want).norm() > 0.02 * want.norm() + 1e-3:
            raise ValueError(f"the packed product is off by {float((got - want).norm() / want.norm()):.3f}")
    except (RuntimeError, ValueError) as exc:
        warnings.warn(f"torch's packed int4 matmul not used ({type(exc).__name__}: {exc})", stacklevel=3)
        return None
    return packed, szt


def scales_and_zeros(scale_zero: torch.Tensor) -> torch.Tensor:
    """(out, groups, 2) (scale, zero) pairs -> the kernel's (groups, out, 2), bf16."""
    return scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16)


def matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int, szt: torch.Tensor) -> torch.Tensor:
    """x (rows, in) bf16 @ the packed weight's transpose -> (rows, out) bf16."""
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, packed, group_size, szt)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, szt)


def dequantize(packed: torch.Tensor, group_size: int, szt: torch.Tensor, in_features: int,
               chunk: int = 1024) -> torch.Tensor:
    """The weight (out, in) float32, read back through the kernel itself: identity rows times the packed
    weight give its transpose (bf16-exact: each output is one code times a scale plus a zero), a
    chunk of input columns at a time. For reports and the reference path, not the hot path."""
    cols = []
    for start in range(0, in_features, chunk):
        n = min(chunk, in_features - start)
        eye = torch.zeros(n, in_features, dtype=torch.bfloat16, device=packed.device)
        eye[:, start : start + n] = torch.eye(n, dtype=torch.bfloat16, device=packed.device)
        cols.append(matmul(eye, packed, group_size, szt).float())  # (n, out): rows start.. of W^T
    return torch.cat(cols).t().contiguous()
