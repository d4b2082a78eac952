// Quantized weights back to bf16, exactly as the reference computes them (engine/quant/schemes.py
// `dequantize`, then `.to(bfloat16)`): int4 w = (q - 8) * scale + zero, int8 w = q * scale, in float32 (the
// product of a small integer and a bf16 scale is exact, so one rounding, to nearest even, as torch's), bit
// for bit the reference's bf16 weight (the AVX-512 int4 body flushes float32 denormals to zero: a weight
// below 1.2e-38 in magnitude, which no real scale gives).
//
// What for: prompt rows on a CPU that multiplies bf16 natively (AMX, AVX512-BF16, Arm BF16). There the
// library GEMM (oneDNN on AMX) ran 6-14x faster than the weight-streaming kernels at 64-512 rows, so a
// quantized layer's prompt rows take the GEMM over its weight dequantized into a scratch buffer
// (engine/quant/schemes.py `gemm_for_many_rows`): the same product as the reference path, at the cost of
// writing the bf16 weight once per call.
//
//   int4t_dequant: the tiles layout (core/linear_tiles.h) into W (N, K); tiles [n0 / 16, n1 / 16).
//   int4_dequant: the chunk layout (core/linear.h) into W (N, K); rows [n0, n1).
//   int8_dequant: int8 rows with one scale each into W (N, K); rows [n0, n1).
#pragma once
#include "linear_tiles.h"

namespace inferlab {

#ifdef INFERLAB_AVX512_VNNI
// 16 codes (bytes) of one row to bf16 weights (q - 8) s + zero at y: (q - 8) s is exact, so the fma rounds
// once, as the reference's multiply then add. vcvtneps2bf16 rounds to nearest even as torch does; it
// flushes float32 denormals to zero (a weight below 1.2e-38, which no real scale gives).
static inline void dequant16(__m128i q, __m512 s, __m512 zero, uint16_t* y) {
  const __m512 v = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), _mm512_set1_ps(8.f)),
                                   s, zero);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// Chunk c (128 bits) of each of a and b: row 4c + r of a tile holds its first 16 columns of a 32-column block
// in chunk c of u[r], the other 16 in chunk c of u[4 + r] (see below).
template <int C>
static inline void dequant_rows4(const __m512i* u, const float* s, const float* zero, uint16_t* w, int64_t K) {
  _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) {
    const int j = 4 * C + r;
    const __m512 sj = _mm512_set1_ps(s[j]), zj = _mm512_set1_ps(zero[j]);
    dequant16(_mm512_extracti32x4_epi32(u[r], C), sj, zj, w + j * K);
    dequant16(_mm512_extracti32x4_epi32(u[4 + r], C), sj, zj, w + j * K + 16);
  }
}

// The tiles layout into W (N, K): per tile, per 32-column block (4 steps of 64 bytes: lane j of step s holds
// row j's columns 8s..8s+3 in its low nibbles, 8s+4..8s+7 in its high ones), the 8 vectors of nibbles (low
// and high of each step, in column order) are transposed so that each row's 32 codes are together, then
// widened 16 at a time.
static void int4t_dequant(const uint8_t* codes, const uint16_t* sz, int64_t K, int64_t group, uint16_t* w,
                          int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  const __m512i low = _mm512_set1_epi8(0x0F);
  alignas(64) float s[16], zero[16];
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t) {
    uint16_t* wt = w + t * kRowTile * K;
    for (int64_t g = 0; g < G; ++g) {
      const uint16_t* z = tile_sz(sz, t, g, K, group);
      _mm512_store_ps(s, Lanes::bf16(z));
      _mm512_store_ps(zero, Lanes::bf16(z + 16));
      const uint8_t* p = tile_codes(codes, t, g, K, group);
      for (int64_t b = 0; b < group / 32; ++b, p += 256) {
        __m512i d[8];  // d[2s]: step s's low nibbles (columns 8s..8s+3), d[2s + 1]: its high ones
        _Pragma("GCC unroll 4") for (int st = 0; st < 4; ++st) {
          const __m512i v = _mm512_loadu_si512(p + 64 * st);
          d[2 * st] = _mm512_and_si512(v, low);
          d[2 * st + 1] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low);
        }
        // 4 x 4 transposes of 32-bit words inside each 128-bit chunk c (rows 4c..4c+3): u[r] chunk c = row
        // 4c + r's words 0-3 (columns 0-15), u[4 + r] chunk c = its words 4-7 (columns 16-31).
        __m512i u[8];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
          const __m512i t0 = _mm512_unpacklo_epi32(d[4 * h], d[4 * h + 1]);
          const __m512i t1 = _mm512_unpackhi_epi32(d[4 * h], d[4 * h + 1]);
          const __m512i t2 = _mm512_unpacklo_epi32(d[4 * h + 2], d[4 * h + 3]);
          const __m512i t3 = _mm512_unpackhi_epi32(d[4 * h + 2], d[4 * h + 3]);
          u[4 * h + 0] = _mm512_unpacklo_epi64(t0, t2);
          u[4 * h + 1] = _mm512_unpackhi_epi64(t0, t2);
          u[4 * h + 2] = _mm512_unpacklo_epi64(t1, t3);
          u[4 * h + 3] = _mm512_unpackhi_epi64(t1, t3);
        }
        uint16_t* wb = wt + g * group + 32 * b;
        dequant_rows4<0>(u, s, zero, wb, K);
        dequant_rows4<1>(u, s, zero, wb, K);
        dequant_rows4<2>(u, s, zero, wb, K);
        dequant_rows4<3>(u, s, zero, wb, K);
      }
    }
  }
}
#else
static void int4t_dequant(const uint8_t* codes, const uint16_t* sz, int64_t K, int64_t group, uint16_t* w,
                          int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = tile_codes(codes, t, g, K, group);
      const uint16_t* z = tile_sz(sz, t, g, K, group);
      for (int64_t st = 0; st < group / 8; ++st, p += 64)
        for (int j = 0; j < kRowTile; ++j) {
          const float s = bf16_to_float(z[j]), zero = bf16_to_float(z[16 + j]);
          uint16_t* out = w + (t * kRowTile + j) * K + g * group + 8 * st;
          for (int i = 0; i < 4; ++i) {
            const uint8_t c = p[4 * j + i];
            out[i] = float_to_bf16(static_cast<float>((c & 0x0F) - 8) * s + zero);
            out[4 + i] = float_to_bf16(static_cast<float>((c >> 4) - 8) * s + zero);
          }
        }
    }
}
#endif

// The chunk layout: byte j of a 32-column chunk holds column j (low nibble) and j + 16 (high one).
static void int4_dequant(const uint8_t* codes, const uint16_t* sz, int64_t K, int64_t group, uint16_t* w, int64_t n0,
                         int64_t n1) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = codes + n * (K / 2);
    for (int64_t c = 0; c < K / 32; ++c) {
      const int64_t g = (c * 32) / group;
      const float s = bf16_to_float(sz[(n * G + g) * 2]), zero = bf16_to_float(sz[(n * G + g) * 2 + 1]);
      uint16_t* out = w + n * K + c * 32;
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = row[c * 16 + j];
        out[j] = float_to_bf16(static_cast<float>((b & 0x0F) - 8) * s + zero);
        out[16 + j] = float_to_bf16(static_cast<float>((b >> 4) - 8) * s + zero);
      }
    }
  }
}

static void int8_dequant(const int8_t* q, const uint16_t* scales, int64_t K, uint16_t* w, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float s = bf16_to_float(scales[n]);
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = float_to_bf16(static_cast<float>(q[n * K + k]) * s);
  }
}

}  // namespace inferlab
