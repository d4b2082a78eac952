// The fused decode step's small ops (fused_decode.cpp), rounded to bf16 where the eager path rounds:
// RMSNorm, rotate-half RoPE, SiLU(gate) * up. No torch here (the harness checks them too).
#pragma once
#include "isa.h"
#include "simd8.h"
#include "attention.h"  // exp512 (the AVX-512 tier)

namespace inferlab {

// RMSNorm as engine/models/layers/norm.py: float32 statistics, normalised value rounded to bf16, then
// times the bf16 weight (rounded again).
inline void rms_norm(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* y) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = bf16_to_float(x[i]);
    ss += v * v;
  }
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    y[i] = float_to_bf16(bf16_to_float(w[i]) * bf16_to_float(float_to_bf16(bf16_to_float(x[i]) * r)));
}

// Rotate-half RoPE on one head in place, as engine/models/layers/rotary.py in bf16: cos and sin rounded
// to bf16, x*cos and rotated*sin each rounded, then their sum.
inline void rope(uint16_t* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  alignas(64) uint16_t out[256];
  for (int64_t j = 0; j < d; ++j) {
    const float rot = j < half ? -bf16_to_float(x[j + half]) : bf16_to_float(x[j - half]);
    const float a = bf16_to_float(float_to_bf16(bf16_to_float(x[j]) * bf16_to_float(float_to_bf16(cos[j]))));
    const float b = bf16_to_float(float_to_bf16(rot * bf16_to_float(float_to_bf16(sin[j]))));
    out[j] = float_to_bf16(a + b);
  }
  std::memcpy(x, out, d * sizeof(uint16_t));
}

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

// act[i] = SiLU(gate[i]) * up[i] for i in [i0, i1), the SiLU rounded to bf16 before the product (as the
// eager path's two ops), then the product rounded.
inline void silu_mul(const uint16_t* gate, const uint16_t* up, uint16_t* act, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(INFERLAB_AVX512_BF16)
  for (; i + 16 <= i1; i += 16) {  // the same two roundings, 16 lanes at a time
    const __m512 gv = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate + i))), 16));
    const __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    const __m512 sr = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(sv)), 16));
    const __m512 uv = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(up + i))), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(act + i), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(sr, uv)));
  }
#elif defined(INFERLAB_SIMD8)
  using namespace s8;
  alignas(32) uint16_t sr[8];
  for (; i + 8 <= i1; i += 8) {
    const vf gv = load_bf16(gate + i);
    store_bf16(sr, div(gv, add(set1(1.f), exp(sub(zero(), gv)))));
    store_bf16(act + i, mul(load_bf16(sr), load_bf16(up + i)));
  }
#endif
  for (; i < i1; ++i) act[i] = float_to_bf16(bf16_to_float(float_to_bf16(silu(bf16_to_float(gate[i])))) * bf16_to_float(up[i]));
}

}  // namespace inferlab
