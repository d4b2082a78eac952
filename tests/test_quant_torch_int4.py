"""int4 through torch's packed int4 matmul (engine/quant/int4_torch.py): the CUDA path's layout and
rule, run here through the CPU twin of the same op (`_weight_int4pack_mm_for_cpu`), against the
reference (dequantize, then multiply); and the choices each device makes."""
from __future__ import annotations

import pytest
import torch

from engine.quant import int4_torch
from engine.quant.weight_only import QuantLinear


def _weight(out_features: int = 192, in_features: int = 256) -> torch.Tensor:
    torch.manual_seed(0)
    return (torch.randn(out_features, in_features) * 0.05).to(torch.bfloat16)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_the_packed_layer_matches_the_reference_and_keeps_one_layout(group_size):
    w = _weight()
    packed = QuantLinear(w, None, "int4", group_size, int4_layout="torch")
    ref = QuantLinear(w, None, "int4", group_size, reference=True)
    assert packed.packed is not None and not hasattr(packed, "codes") and not hasattr(packed, "scale_zero")
    assert ref.packed is None and ref.codes is not None  # the reference keeps the readable layout
    for rows in (1, 5, 64):
        x = torch.randn(rows, 256).to(torch.bfloat16)
        torch.testing.assert_close(packed(x).float(), ref(x).float(), atol=2e-2, rtol=2e-2)
    # read back through the kernel: bf16-exact codes x scales + zeros
    torch.testing.assert_close(packed.dequantize(), ref.dequantize(), atol=4e-3, rtol=1e-2)
    assert packed.nbytes() < w.numel() * 2 / 3  # ~half a byte a weight plus its (scale, zero) pairs


def test_outliers_and_bias_ride_along_with_the_packed_matmul():
    w, bias = _weight(), torch.randn(192).to(torch.bfloat16)
    idx = torch.tensor([3, 77])
    packed = QuantLinear(w, bias, "int4", 32, outlier_idx=idx, int4_layout="torch")
    ref = QuantLinear(w, bias, "int4", 32, outlier_idx=idx, reference=True)
    x = torch.randn(3, 256).to(torch.bfloat16)
    torch.testing.assert_close(packed(x).float(), ref(x).float(), atol=3e-2, rtol=2e-2)


def test_where_the_packed_matmul_applies():
    cpu = torch.device("cpu")
    assert int4_torch.applies(cpu, torch.bfloat16, 192, 256, 32)
    assert not int4_torch.applies(cpu, torch.float16, 192, 256, 32)  # the kernel takes bf16 only
    assert not int4_torch.applies(cpu, torch.bfloat16, 192, 200, 8)  # group size and k tiling
    assert [int4_torch.inner_k_tiles(k) for k in (128, 576, 96, 40)] == [8, 4, 2, None]
    # fp16 falls back to the native layout (the dequantize path on a GPU); "auto" on the CPU: native
    assert QuantLinear(_weight().half(), None, "int4", 32, int4_layout="torch").packed is None
    assert QuantLinear(_weight(), None, "int4", 32).packed is None


def test_a_self_draft_is_4_bit_only_where_a_fast_int4_kernel_runs(monkeypatch, tiny_llama):
    """On CUDA the choice follows torch's int4 matmul (bf16, compute capability 8.0+; the GPU is
    simulated: only its capability is asked); elsewhere in CUDA the 4-bit layer would dequantize its
    whole weight on every call, slower than the target, so the self-draft takes 8 bits."""
    from engine.loading.loader import load_hf_folder
    from engine.spec.draft import self_draft_format

    mc = load_hf_folder(str(tiny_llama), lambda message, fraction: None).config
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert self_draft_format(cuda, torch.bfloat16, mc, 32) == "int4"
    assert self_draft_format(cuda, torch.float16, mc, 32) == "int8"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert self_draft_format(cuda, torch.bfloat16, mc, 32) == "int8"
    assert self_draft_format(torch.device("cpu"), torch.bfloat16, mc, 32) == "int4"  # the native int4 kernel


def test_a_packing_that_disagrees_with_the_rule_is_not_used(monkeypatch):
    """The layout is checked once per layer with one product: were this torch's layout not the one
    assumed (the nibble order, say), the layer keeps the native layout instead of computing garbage."""
    real_pack = int4_torch.pack
    monkeypatch.setattr(int4_torch, "pack", lambda q: real_pack(15 - q))  # codes mirrored: a wrong layout
    with pytest.warns(UserWarning, match="packed int4 matmul not used"):
        layer = QuantLinear(_weight(), None, "int4", 32, int4_layout="torch")
    assert layer.packed is None and layer.codes is not None
