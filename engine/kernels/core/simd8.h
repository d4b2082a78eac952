// Eight float32 lanes, one spelling for the AVX2 and the NEON tier (as ggml's simd-mappings.h): the
// float bodies (bf16 rows, int8 and int4 rows with float activations, attention, SiLU) are written once
// over these, and compile to one __m256 on AVX2 and two float32x4_t on NEON. The integer dot products of
// the int8-activation bodies differ too much between the two (maddubs/madd vs sdot) and are per ISA in
// core/linear.h.
#pragma once
#include "isa.h"

#ifdef INFERLAB_SIMD8
namespace inferlab::s8 {

#ifdef INFERLAB_AVX2
using vf = __m256;
inline vf zero() { return _mm256_setzero_ps(); }
inline vf set1(float v) { return _mm256_set1_ps(v); }
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c
inline float hsum(vf v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
inline float hmax(vf v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
// 8 bf16 -> 8 float32 (exact: a bf16 is the top half of a float32)
inline vf load_bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
// 8 int8 -> 8 float32
inline vf load_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// 16 bytes of 4-bit codes -> their low nibbles (o[0], o[1]: bytes 0-7, 8-15) and high nibbles (o[2], o[3])
inline void load_nibbles(const uint8_t* p, vf o[4]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  o[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  o[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  o[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  o[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}
// round to nearest even into 8 bf16, NaN kept a NaN (as float_to_bf16)
inline void store_bf16(uint16_t* p, vf v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
// 2^n for whole n in [-126, 127] (n as a float holding an integer)
inline vf pow2n(vf n) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline vf round_nearest(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#else  // NEON: two float32x4_t
struct vf {
  float32x4_t a, b;
};
inline vf zero() { return {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; }
inline vf set1(float v) { return {vdupq_n_f32(v), vdupq_n_f32(v)}; }
inline vf load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void store(float* p, vf v) { vst1q_f32(p, v.a); vst1q_f32(p + 4, v.b); }
inline vf add(vf x, vf y) { return {vaddq_f32(x.a, y.a), vaddq_f32(x.b, y.b)}; }
inline vf sub(vf x, vf y) { return {vsubq_f32(x.a, y.a), vsubq_f32(x.b, y.b)}; }
inline vf mul(vf x, vf y) { return {vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b)}; }
inline vf div(vf x, vf y) { return {vdivq_f32(x.a, y.a), vdivq_f32(x.b, y.b)}; }
inline vf max(vf x, vf y) { return {vmaxq_f32(x.a, y.a), vmaxq_f32(x.b, y.b)}; }
inline vf min(vf x, vf y) { return {vminq_f32(x.a, y.a), vminq_f32(x.b, y.b)}; }
inline vf fma(vf x, vf y, vf c) { return {vfmaq_f32(c.a, x.a, y.a), vfmaq_f32(c.b, x.b, y.b)}; }
inline float hsum(vf v) { return vaddvq_f32(vaddq_f32(v.a, v.b)); }
inline float hmax(vf v) { return vmaxvq_f32(vmaxq_f32(v.a, v.b)); }
inline vf load_bf16(const uint16_t* p) {
  const uint16x8_t h = vld1q_u16(p);
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
          vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16))};
}
inline vf load_i8(const int8_t* p) {
  const int16x8_t w = vmovl_s8(vld1_s8(p));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)))};
}
inline vf u8x8_to_f(uint8x8_t b) {
  const uint16x8_t w = vmovl_u8(b);
  return {vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(w)))};
}
inline void load_nibbles(const uint8_t* p, vf o[4]) {
  const uint8x16_t b = vld1q_u8(p);
  const uint8x16_t lo = vandq_u8(b, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(b, 4);
  o[0] = u8x8_to_f(vget_low_u8(lo));
  o[1] = u8x8_to_f(vget_high_u8(lo));
  o[2] = u8x8_to_f(vget_low_u8(hi));
  o[3] = u8x8_to_f(vget_high_u8(hi));
}
inline uint16x4_t to_bf16x4(float32x4_t v) {
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  uint32x4_t r = vshrq_n_u32(vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
  r = vbslq_u32(vceqq_f32(v, v), r, vdupq_n_u32(0x7fc0));  // NaN stays a NaN
  return vmovn_u32(r);
}
inline void store_bf16(uint16_t* p, vf v) { vst1q_u16(p, vcombine_u16(to_bf16x4(v.a), to_bf16x4(v.b))); }
inline vf pow2n(vf n) {
  const int32x4_t bias = vdupq_n_s32(127);
  return {vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.a), bias), 23)),
          vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.b), bias), 23))};
}
inline vf round_nearest(vf v) { return {vrndnq_f32(v.a), vrndnq_f32(v.b)}; }
#endif

// e^x, x clamped to [-87, 88]: 2^n e^r with r in [-ln2/2, ln2/2], Cephes' polynomial (as the AVX-512 body)
inline vf exp(vf x) {
  x = min(max(x, set1(-87.f)), set1(88.f));
  const vf n = round_nearest(mul(x, set1(1.44269504088896341f)));
  vf r = sub(x, mul(n, set1(0.693359375f)));
  r = sub(r, mul(n, set1(-2.12194440e-4f)));
  vf p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  p = fma(p, mul(r, r), add(r, set1(1.f)));
  return mul(p, pow2n(n));
}

}  // namespace inferlab::s8
#endif
