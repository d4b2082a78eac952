// int4 weights in tiles of 16 output rows (the "tiles" layout; engine/quant/schemes.py pack_int4_tiles),
// the layout llama.cpp repacks its 4-bit weights into, for the CPUs whose vector is 16 int32 lanes wide
// (AVX-512): each lane of a product is one output row, so a step needs no horizontal sums and no
// shuffles of x (x goes in as broadcasts of 4 of its bytes), and a tile's codes are one stream in memory.
//
//   codes (N, K / 2) uint8: rows 16t..16t+15 hold tile t; inside it group g (group columns) is group / 8
//     steps of 64 bytes; byte 4j + i of step s is row 16t + j, column g * group + 8s + i in its low
//     nibble and column g * group + 8s + 4 + i in its high one.
//   scale_zero (N, K / group, 2) bf16: rows 16t..16t+15 hold tile t: per group its 16 scales, then its 16
//     zeros. w = (q - 8) * scale + zero, as the chunk layout's.
//
// Two products, as for the chunk layout (core/linear.h):
//   int4t_q8:  x rounded to int8 per 32 columns (quantize_row_q8), integer products (vpdpbusd), per group
//              scale * (sum_b d_b sum q xq - 8 X_g) + zero * X_g, X_g the group's sum of x as rounded;
//   int4t:     x in float32 (exact), per group scale * (sum q x - 8 X_g) + zero * X_g.
// Every row of x is summed in the same order whatever rows share the call (a row's result is its own).
// The AVX-512 bodies are the fast ones; every other tier runs the plain C++ body (correct, slower: the
// engine picks this layout only where the avx512 tier runs, engine/quant/schemes.py).
// Callers hand out rows in whole tiles: n0 and n1 multiples of 16 (N is).
#pragma once
#include "linear.h"

namespace inferlab {

static constexpr int64_t kRowTile = 16;
static constexpr int64_t kTilesAhead = 6400;  // bytes of codes asked into L2 ahead of the step (measured)

// Where group g of tile t starts: its codes (group * 8 bytes) and its 32 (scale, zero) halves.
static inline const uint8_t* tile_codes(const uint8_t* codes, int64_t t, int64_t g, int64_t K, int64_t group) {
  return codes + t * kRowTile * (K / 2) + g * group * 8;
}
static inline const uint16_t* tile_sz(const uint16_t* sz, int64_t t, int64_t g, int64_t K, int64_t group) {
  return sz + (t * (K / group) + g) * 32;
}

// Per row of x for int4t_q8: its int8 values, one scale per 32 columns, and the group sums X_g.
struct Q4t {
  int8_t* xq;
  float* d;
  float* gx;
};

static int64_t q4t_scratch_floats(int64_t M, int64_t K) { return M * (K / 4 + 2 * (K / 32) + 16) + 16; }

static void int4t_q8_prepare(const uint16_t* x, int64_t M, int64_t K, int64_t group, float* scratch, Q4t* xs) {
  Carve c{scratch};
  for (int64_t m = 0; m < M; ++m) {
    xs[m] = {reinterpret_cast<int8_t*>(c.take(K / 4 + 4)), c.take(K / 32 + 4), c.take(K / 32 + 4)};
    quantize_row_q8(x + m * K, K, xs[m].xq, xs[m].d);
    for (int64_t g = 0; g < K / group; ++g) {
      float sum = 0.f;  // x as rounded, so the zero term cancels the codes' offset of 8 exactly
      for (int64_t b = g * group / kQBlock; b < (g + 1) * group / kQBlock; ++b) {
        int32_t s = 0;
        for (int64_t k = b * kQBlock; k < (b + 1) * kQBlock; ++k) s += xs[m].xq[k];
        sum += xs[m].d[b] * static_cast<float>(s);
      }
      xs[m].gx[g] = sum;
    }
  }
}

// x widened to float32 (M * K) and its group sums (M * K / group) for int4t.
static int64_t f4t_scratch_floats(int64_t M, int64_t K) { return M * (K + K / 32) + 16; }

static void int4t_prepare(const uint16_t* x, int64_t M, int64_t K, int64_t group, float* scratch) {
  float* gx = scratch + M * K;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K / group; ++g) {
      float sum = 0.f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += (scratch[m * K + k] = bf16_to_float(x[m * K + k]));
      gx[m * (K / group) + g] = sum;
    }
}

#ifdef INFERLAB_AVX512_VNNI
static inline __m512 bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

static inline void store16(__m512 v, uint16_t* y, const float* bias, int64_t n) {
  if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + n), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// Tiles [n0 / 16, n1 / 16) against T rows of x (int8).
template <int T>
static void int4t_q8_rows(const Q4t* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                          int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t) {
    __m512 acc[T], acz[T];
    for (int m = 0; m < T; ++m) acc[m] = acz[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = tile_codes(codes, t, g, K, group);
      __m512 u[T];
      for (int m = 0; m < T; ++m) u[m] = _mm512_set1_ps(-8.f * xs[m].gx[g]);
      for (int64_t b = 0; b < group / kQBlock; ++b, p += 256) {
        _Pragma("GCC unroll 4") for (int q = 0; q < 256; q += 64) prefetch_l2(reinterpret_cast<const char*>(p) + kTilesAhead + q);
        __m512i il[T], ih[T];  // low nibbles, and high ones as 16 q (no shift: the sum is shifted once)
        for (int m = 0; m < T; ++m) il[m] = ih[m] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int s = 0; s < 4; ++s) {
          const __m512i v = _mm512_loadu_si512(p + 64 * s);
          const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(v, high);
          const int64_t k = g * group + b * kQBlock + 8 * s;
          for (int m = 0; m < T; ++m) {
            int32_t w0, w1;
            std::memcpy(&w0, xs[m].xq + k, 4);
            std::memcpy(&w1, xs[m].xq + k + 4, 4);
            il[m] = _mm512_dpbusd_epi32(il[m], lo, _mm512_set1_epi32(w0));
            ih[m] = _mm512_dpbusd_epi32(ih[m], hi, _mm512_set1_epi32(w1));
          }
        }
        const int64_t blk = (g * group) / kQBlock + b;
        for (int m = 0; m < T; ++m) {
          const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(il[m], _mm512_srai_epi32(ih[m], 4)));
          u[m] = _mm512_fmadd_ps(f, _mm512_set1_ps(xs[m].d[blk]), u[m]);
        }
      }
      const uint16_t* z = tile_sz(sz, t, g, K, group);
      const __m512 ws = bf16x16(z), wz = bf16x16(z + 16);
      for (int m = 0; m < T; ++m) {
        acc[m] = _mm512_fmadd_ps(ws, u[m], acc[m]);
        acz[m] = _mm512_fmadd_ps(wz, _mm512_set1_ps(xs[m].gx[g]), acz[m]);
      }
    }
    for (int m = 0; m < T; ++m) store16(_mm512_add_ps(acc[m], acz[m]), y + m * N, bias, t * kRowTile);
  }
}

// Tiles [n0 / 16, n1 / 16) against T rows of x (float32: xf (T, K), gx (T, K / group)).
template <int T>
static void int4t_rows(const float* xf, const float* gx, const uint8_t* codes, const uint16_t* sz, uint16_t* y,
                       const float* bias, int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  const __m512i low = _mm512_set1_epi8(0x0F), byte = _mm512_set1_epi32(0xFF);
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t) {
    __m512 acc[T], acz[T];
    for (int m = 0; m < T; ++m) acc[m] = acz[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = tile_codes(codes, t, g, K, group);
      __m512 qx[T];
      for (int m = 0; m < T; ++m) qx[m] = _mm512_setzero_ps();
      for (int64_t s = 0; s < group / 8; ++s, p += 64) {
        if ((s & 3) == 0)
          _Pragma("GCC unroll 4") for (int q = 0; q < 256; q += 64) prefetch_l2(reinterpret_cast<const char*>(p) + kTilesAhead + q);
        const __m512i v = _mm512_loadu_si512(p);
        const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), low);
        __m512 c[8];  // the codes of columns 8s + i (i < 4: low nibbles, else high), one lane per row
        for (int i = 0; i < 4; ++i) {
          c[i] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(lo, 8 * i), byte));
          c[4 + i] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(hi, 8 * i), byte));
        }
        const int64_t k = g * group + 8 * s;
        for (int m = 0; m < T; ++m) {
          const float* xk = xf + m * K + k;
          __m512 a = _mm512_mul_ps(c[0], _mm512_set1_ps(xk[0])), b = _mm512_mul_ps(c[1], _mm512_set1_ps(xk[1]));
          __m512 e = _mm512_mul_ps(c[4], _mm512_set1_ps(xk[4])), h = _mm512_mul_ps(c[5], _mm512_set1_ps(xk[5]));
          a = _mm512_fmadd_ps(c[2], _mm512_set1_ps(xk[2]), a);
          b = _mm512_fmadd_ps(c[3], _mm512_set1_ps(xk[3]), b);
          e = _mm512_fmadd_ps(c[6], _mm512_set1_ps(xk[6]), e);
          h = _mm512_fmadd_ps(c[7], _mm512_set1_ps(xk[7]), h);
          qx[m] = _mm512_add_ps(qx[m], _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(e, h)));
        }
      }
      const uint16_t* z = tile_sz(sz, t, g, K, group);
      const __m512 ws = bf16x16(z), wz = bf16x16(z + 16);
      for (int m = 0; m < T; ++m) {
        const float X = gx[m * G + g];
        acc[m] = _mm512_fmadd_ps(ws, _mm512_add_ps(qx[m], _mm512_set1_ps(-8.f * X)), acc[m]);
        acz[m] = _mm512_fmadd_ps(wz, _mm512_set1_ps(X), acz[m]);
      }
    }
    for (int m = 0; m < T; ++m) store16(_mm512_add_ps(acc[m], acz[m]), y + m * N, bias, t * kRowTile);
  }
}
#else
// The plain C++ bodies: the same sums, one row at a time.
template <int T>
static void int4t_q8_rows(const Q4t* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                          int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t t = n / kRowTile, j = n % kRowTile;
    for (int m = 0; m < T; ++m) {
      float acc = 0.f, acz = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = tile_codes(codes, t, g, K, group);
        float u = -8.f * xs[m].gx[g];
        for (int64_t b = 0; b < group / kQBlock; ++b) {
          int32_t dot = 0;
          for (int s = 0; s < 4; ++s)
            for (int i = 0; i < 4; ++i) {
              const uint8_t v = p[(b * 4 + s) * 64 + 4 * j + i];
              const int64_t k = g * group + b * kQBlock + 8 * s + i;
              dot += (v & 0x0F) * xs[m].xq[k] + (v >> 4) * xs[m].xq[k + 4];
            }
          u += static_cast<float>(dot) * xs[m].d[(g * group) / kQBlock + b];
        }
        const uint16_t* z = tile_sz(sz, t, g, K, group);
        acc += bf16_to_float(z[j]) * u;
        acz += bf16_to_float(z[16 + j]) * xs[m].gx[g];
      }
      y[m * N + n] = out(acc + acz, bias, n);
    }
  }
}

template <int T>
static void int4t_rows(const float* xf, const float* gx, const uint8_t* codes, const uint16_t* sz, uint16_t* y,
                       const float* bias, int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t t = n / kRowTile, j = n % kRowTile;
    for (int m = 0; m < T; ++m) {
      float acc = 0.f, acz = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = tile_codes(codes, t, g, K, group);
        float qx = 0.f;
        for (int64_t s = 0; s < group / 8; ++s)
          for (int i = 0; i < 4; ++i) {
            const uint8_t v = p[s * 64 + 4 * j + i];
            const float* xk = xf + m * K + g * group + 8 * s;
            qx += static_cast<float>(v & 0x0F) * xk[i] + static_cast<float>(v >> 4) * xk[4 + i];
          }
        const float X = gx[m * G + g];
        const uint16_t* z = tile_sz(sz, t, g, K, group);
        acc += bf16_to_float(z[j]) * (qx - 8.f * X);
        acz += bf16_to_float(z[16 + j]) * X;
      }
      y[m * N + n] = out(acc + acz, bias, n);
    }
  }
}
#endif

// Rows [n0, n1) (whole tiles) of y (M, N) for M rows of x prepared by int4t_q8_prepare; 4 rows a pass.
static void int4t_q8_range(const Q4t* xs, int64_t M, const uint8_t* codes, const uint16_t* sz, int64_t group,
                           const float* bias, int64_t K, int64_t N, uint16_t* y, int64_t n0, int64_t n1) {
  using Fn = void (*)(const Q4t*, const uint8_t*, const uint16_t*, uint16_t*, const float*, int64_t, int64_t,
                      int64_t, int64_t, int64_t);
  static const Fn table[kTile] = {int4t_q8_rows<1>, int4t_q8_rows<2>, int4t_q8_rows<3>, int4t_q8_rows<4>};
  for (int64_t m0 = 0; m0 < M; m0 += kTile)
    table[std::min(kTile, M - m0) - 1](xs + m0, codes, sz, y + m0 * N, bias, K, N, group, n0, n1);
}

// Rows [n0, n1) (whole tiles) of y (M, N) for M rows of x prepared by int4t_prepare into `scratch`.
static void int4t_range(const float* scratch, int64_t M, const uint8_t* codes, const uint16_t* sz, int64_t group,
                        const float* bias, int64_t K, int64_t N, uint16_t* y, int64_t n0, int64_t n1) {
  using Fn = void (*)(const float*, const float*, const uint8_t*, const uint16_t*, uint16_t*, const float*, int64_t,
                      int64_t, int64_t, int64_t, int64_t);
  static const Fn table[kTile] = {int4t_rows<1>, int4t_rows<2>, int4t_rows<3>, int4t_rows<4>};
  const float* gx = scratch + M * K;
  for (int64_t m0 = 0; m0 < M; m0 += kTile)
    table[std::min(kTile, M - m0) - 1](scratch + m0 * K, gx + m0 * (K / group), codes, sz, y + m0 * N, bias, K, N,
                                       group, n0, n1);
}

}  // namespace inferlab
