"""Rounding float32 to the activations' dtype the way torch rounds (to nearest, ties to even), written out.

A float32 -> bf16 conversion in a kernel rounds to nearest-even on a GPU, but Triton 3.6's interpreter (the
CPU tests) cuts the low bits off instead: the same kernel gave other bf16 values there than on a GPU and than
torch. So every kernel rounds through `rounded` (a few integer ops on a value it already holds), and the
conversion that follows is exact on both: the interpreter's results are the GPU's. NaN stays NaN (the
sampler must still see a NaN row) and infinities stay infinite."""
import triton
import triton.language as tl


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """x (float32) rounded to `dtype`, returned as float32 (every value exact in `dtype`)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif dtype == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x
