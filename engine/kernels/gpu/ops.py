"""Every Triton kernel of the CUDA decode step, by what it does (engine/kernels/gpu/__init__.py)."""
from engine.kernels.gpu.act import silu_and_mul
from engine.kernels.gpu.attention import decode_splits, paged_decode, paged_prefill
from engine.kernels.gpu.norm import add_rms_norm
from engine.kernels.gpu.rope import rope_and_cache
from engine.kernels.gpu.sampling import sample

__all__ = ["add_rms_norm", "decode_splits", "paged_decode", "paged_prefill", "rope_and_cache", "sample",
           "silu_and_mul"]
