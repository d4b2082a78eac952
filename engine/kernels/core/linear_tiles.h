// int4 weights in tiles of 16 output rows (the "tiles" layout; engine/quant/schemes.py pack_int4_tiles),
// the idea of llama.cpp's repacked 4-bit layouts: each lane of a product is one output row (16 int32
// lanes of AVX-512: a tile; 8 of AVX2: half a tile), so a step needs no horizontal sums and no
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
// Bodies: AVX-512 (16 lanes, a tile at once), AVX2 (8 lanes, a tile as two halves), plain C++ elsewhere
// (NEON included: correct, slower; engine/quant/schemes.py picks the layout per tier).
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
// The vector the tiles bodies work in: 16 float / int32 lanes, a whole tile.
struct Lanes {
  using F = __m512;
  using I = __m512i;
  static constexpr int n = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I shr32(I a, int k) { return _mm512_srli_epi32(a, k); }
  static F byte_at(I a, int i) {  // byte i of each 32-bit lane, as float
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(a, 8 * i), _mm512_set1_epi32(0xFF)));
  }
  static F bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static void store(F v, uint16_t* y, const float* bias, int64_t n) {
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + n), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
};

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
      const __m512 ws = Lanes::bf16(z), wz = Lanes::bf16(z + 16);
      for (int m = 0; m < T; ++m) {
        acc[m] = _mm512_fmadd_ps(ws, u[m], acc[m]);
        acz[m] = _mm512_fmadd_ps(wz, _mm512_set1_ps(xs[m].gx[g]), acz[m]);
      }
    }
    for (int m = 0; m < T; ++m) Lanes::store(_mm512_add_ps(acc[m], acz[m]), y + m * N, bias, t * kRowTile);
  }
}
#elif defined(INFERLAB_AVX2)
// The AVX2 bodies: 8 int32 lanes, so a tile is two halves of 8 rows, one after the other (the second reads
// the tile's lines from L1). No VNNI: codes times x bytes in pairs into int16 (vpmaddubsw: at most 7620 a
// step, 30480 over a 32-column block, so a block sums in int16 without saturating), then the int16 pairs
// into int32 (vpmaddwd with ones): 4 columns a lane.
struct Lanes {
  using F = __m256;
  using I = __m256i;
  static constexpr int n = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I shr32(I a, int k) { return _mm256_srli_epi32(a, k); }
  static F byte_at(I a, int i) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(a, 8 * i), _mm256_set1_epi32(0xFF)));
  }
  static F bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static void store(F v, uint16_t* y, const float* bias, int64_t n) {
    alignas(32) float f[8];
    _mm256_store_ps(f, v);
    for (int i = 0; i < 8; ++i) y[n + i] = out(f[i], bias, n + i);
  }
};

template <int T>
static void int4t_q8_rows(const Q4t* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                          int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t G = K / group;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t)
    for (int h = 0; h < 2; ++h) {
      __m256 acc[T];
      for (int m = 0; m < T; ++m) acc[m] = _mm256_setzero_ps();
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = tile_codes(codes, t, g, K, group);
        __m256 u[T];
        for (int m = 0; m < T; ++m) u[m] = _mm256_set1_ps(-8.f * xs[m].gx[g]);
        for (int64_t b = 0; b < group / kQBlock; ++b, p += 256) {
          if (h == 0)
            _Pragma("GCC unroll 4") for (int q = 0; q < 256; q += 64) prefetch_l2(reinterpret_cast<const char*>(p) + kTilesAhead + q);
          __m256i s16[T];
          for (int m = 0; m < T; ++m) s16[m] = _mm256_setzero_si256();
          _Pragma("GCC unroll 4") for (int s = 0; s < 4; ++s) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * s + 32 * h));
            const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            const int64_t k = g * group + b * kQBlock + 8 * s;
            for (int m = 0; m < T; ++m) {
              int32_t w0, w1;
              std::memcpy(&w0, xs[m].xq + k, 4);
              std::memcpy(&w1, xs[m].xq + k + 4, 4);
              s16[m] = _mm256_add_epi16(s16[m], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(w0)),
                                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(w1))));
            }
          }
          const int64_t blk = (g * group) / kQBlock + b;
          for (int m = 0; m < T; ++m) {
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[m], ones));
            u[m] = _mm256_fmadd_ps(f, _mm256_set1_ps(xs[m].d[blk]), u[m]);
          }
        }
        const uint16_t* z = tile_sz(sz, t, g, K, group);
        const __m256 ws = Lanes::bf16(z + 8 * h), wz = Lanes::bf16(z + 16 + 8 * h);
        for (int m = 0; m < T; ++m)
          acc[m] = _mm256_fmadd_ps(wz, _mm256_set1_ps(xs[m].gx[g]), _mm256_fmadd_ps(ws, u[m], acc[m]));
      }
      for (int m = 0; m < T; ++m) Lanes::store(acc[m], y + m * N, bias, t * kRowTile + 8 * h);
    }
}
#endif

#if defined(INFERLAB_AVX512_VNNI) || defined(INFERLAB_AVX2)
// Tiles [n0 / 16, n1 / 16) against T rows of x (float32: xf (T, K), gx (T, K / group)), Lanes::n rows at a
// time (a tile in 16 / Lanes::n passes).
template <int T>
static void int4t_rows(const float* xf, const float* gx, const uint8_t* codes, const uint16_t* sz, uint16_t* y,
                       const float* bias, int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  using L = Lanes;
  using F = L::F;
  const int64_t G = K / group;
  const auto low = L::bytes(0x0F);
  for (int64_t t = n0 / kRowTile; t < n1 / kRowTile; ++t)
    for (int h = 0; h < kRowTile / L::n; ++h) {  // rows 16t + h n .. of the tile
      F acc[T];
      for (int m = 0; m < T; ++m) acc[m] = L::zero();
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = tile_codes(codes, t, g, K, group);
        F qx[T];
        for (int m = 0; m < T; ++m) qx[m] = L::zero();
        for (int64_t s = 0; s < group / 8; ++s, p += 64) {
          if (h == 0 && (s & 3) == 0)
            _Pragma("GCC unroll 4") for (int q = 0; q < 256; q += 64) prefetch_l2(reinterpret_cast<const char*>(p) + kTilesAhead + q);
          const auto v = L::load(p + 4 * L::n * h);
          const auto lo = L::and_(v, low), hi = L::and_(L::shr32(v, 4), low);
          F c[8];  // the codes of columns 8s + i (i < 4: low nibbles, else high), one lane per row
          for (int i = 0; i < 4; ++i) c[i] = L::byte_at(lo, i), c[4 + i] = L::byte_at(hi, i);
          const int64_t k = g * group + 8 * s;
          for (int m = 0; m < T; ++m) {  // a tree of 8 products: the chain across steps is one add
            const float* xk = xf + m * K + k;
            F a = L::mul(c[0], L::set1(xk[0])), b = L::mul(c[1], L::set1(xk[1]));
            F e = L::mul(c[4], L::set1(xk[4])), f = L::mul(c[5], L::set1(xk[5]));
            a = L::fma(c[2], L::set1(xk[2]), a);
            b = L::fma(c[3], L::set1(xk[3]), b);
            e = L::fma(c[6], L::set1(xk[6]), e);
            f = L::fma(c[7], L::set1(xk[7]), f);
            qx[m] = L::add(qx[m], L::add(L::add(a, b), L::add(e, f)));
          }
        }
        const uint16_t* z = tile_sz(sz, t, g, K, group) + L::n * h;
        const F ws = L::bf16(z), wz = L::bf16(z + 16);
        for (int m = 0; m < T; ++m) {
          const float X = gx[m * G + g];
          acc[m] = L::fma(wz, L::set1(X), L::fma(ws, L::add(qx[m], L::set1(-8.f * X)), acc[m]));
        }
      }
      for (int m = 0; m < T; ++m) L::store(acc[m], y + m * N, bias, t * kRowTile + L::n * h);
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
