// Weight-streaming linear layers for a few rows (decode): y = x W^T, each weight read once per call.
//
// At one token per step a Linear is a matrix-vector product: every weight is loaded once and used
// for one multiply-add per row of x, so the speed is the speed of reading the weights. These kernels
// read the one plain copy the engine keeps (no packed second copy):
//
//   stream_linear_bf16: W (N, K) bf16 as stored. Rows of x up to 8 are done in one pass over W; more in
//     passes of 8 over blocks of W that stay in cache (bf16_rows_any).
//   stream_linear_int8: W as int8 rows with one scale each (8-bit layers, an int8 lm_head), up to 8 rows.
//   stream_linear_int4: W as 4-bit codes, half a byte per weight, plus one bf16 (scale, zero) per
//     group of input columns:  w = (q - 8) * scale + zero,  q in [0, 15].
//     Codes layout (N, K / 2) uint8, in chunks of 32 columns (16 bytes): byte j of a chunk holds
//     column j in its low nibble and column j + 16 in its high nibble, so a chunk unpacks into two
//     runs of 16 consecutive columns. Any number of rows; x is taken 4 rows at a time.
//   stream_linear_int4_tiles (core/linear_tiles.h): the same weights laid out in tiles of 16 rows, one
//     vector lane per output row: the layout 4-bit layers take where the avx512 or avx2 tier runs.
//
// One body per ISA tier computes the same thing (core/isa.h):
//   avx512: bf16 pairs multiplied into float32 sums (vdpbf16ps). Its int4 body turns each code into the
//     bf16 number 128 + q by OR-ing it into the bit pattern of 128.0 (bf16 0x4300 has 7 mantissa bits:
//     128 + q for q < 16 is exact), so
//       sum_k w_k x_k = scale * sum_k (128 + q_k) x_k + (zero - 136 * scale) * sum_k x_k     per group.
//   avx2, neon: weights widened to float32 eight at a time (a bf16 is the top half of a float32) and
//     fused multiply-adds into float32 sums, x widened once per call (core/simd8.h); int4 as
//       sum_k w_k x_k = scale * sum_k q_k x_k + (zero - 8 * scale) * sum_k x_k                per group.
//   portable: the same sums in plain C++.
// The callers split output rows between threads (stream_linear.cpp, fused_decode.cpp).
#pragma once
#include <atomic>
#include "isa.h"
#include "simd8.h"

namespace inferlab {

static constexpr int64_t kMaxRows = 8;  // rows of x per pass over W (bf16, int8)
static constexpr int64_t kTile = 4;     // rows of x per pass over W (int4)
static inline uint16_t out(float v, const float* bias, int64_t n) {
  return float_to_bf16(bias == nullptr ? v : v + bias[n]);
}

// ---------------------------------------------------------------------------------------------- bf16
// How the bodies below walk W for up to 8 rows of x, chosen per CPU by measurement at the first build
// (engine/kernels/tier_choice.py, set_bf16_body): kBf16Tiles, R weight rows a tile with the next tile
// prefetched (best on a Sapphire Rapids Xeon, below), or kBf16Rows, one weight row after the other with no
// software prefetch (kBf16Stream: the same, each line also asked for kStreamAhead bytes early): W read as one
// sequential stream, which a Zen 4 serves best (there
// R rows a tile are R streams, and a decode step's bf16 sweep ran ~2x as long: SmolLM2-135M's matrices, one
// row of x, 1 thread, scripts/bf16_rows_ab.sh). Each (weight row, row of x) pair keeps its own accumulator
// in both, summed along K in the same order: the two give the same numbers, bit for bit, so the choice
// changes speed only. More than 8 rows of x (blocks of W in cache) always take the tiles.
enum Bf16Body : int { kBf16Tiles = 0, kBf16Rows = 1, kBf16Stream = 2 };
inline std::atomic<int> g_bf16_body{kBf16Tiles};

// Every body below works in tiles: R weight rows against G rows of x, one accumulator per (weight row, row
// of x), summed along K in one order whatever R and G are, so a row's result does not depend on how many
// rows share the call (a verify's rows, a batch's) and stays bit for bit the one-row result; R and G only
// choose how many loads each multiply-add shares (R weight rows per x load, G rows of x per weight load).
// The R weight rows are R streams from memory, which the hardware prefetcher alone served at a third of
// one stream's speed; so a tile asks for the next tile's bytes, in address order, kTileAhead bytes past
// its start, R cache lines per 32 columns: into L1 for one row of x, into L2 for more (into L1 the next
// tile crowded out the current one at K = 1536). Past the end of its rows it asks for whatever follows
// (the next matrix in the weights' arena: a prefetch never faults), as the hardware prefetcher would.
static constexpr int64_t kTileAhead = 3072;
// kBf16Rows reads W as one stream; the hardware prefetcher alone kept a Zen 4 core ~5-10 % under its plain
// read, so the walk also asks for the line kStreamAhead bytes past the one it loads, into L2 (1-2 KiB
// ahead measured best, 4 KiB worse than none; a sweep of SmolLM2-135M's matrices, 1 and 2 threads).
static constexpr int64_t kStreamAhead = 2048;
enum Prefetch : int { kNoPrefetch = 0, kPrefetchTile = 1, kPrefetchStream = 2 };
template <int R, int G>
__attribute__((always_inline)) static inline void prefetch_tile(const char*& pf) {
  _Pragma("GCC unroll 16") for (int q = 0; q < R; ++q, pf += 64) {
    if constexpr (G == 1) prefetch_l1(pf);
    else prefetch_l2(pf);
  }
}

#ifdef INFERLAB_AVX512_BF16
// The sum of 16 lanes in one written order: lanes i + (i + 8), then + 4, + 2, + 1 (the order of GCC's
// _mm512_reduce_add_ps, written out so that every compiler sums alike). hsum16 takes 16 sums in that same
// order at once; a row's sum is the same bit for bit whichever of the two takes it.
static inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// 16 accumulators a[0..16) -> their sums in one vector: a[i]'s at lane 4 * (i % 4) + i / 4 (see hsum).
static inline __m512 hsum16(const __m512* a) {
  __m512 s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; ++i)  // lanes j and j + 8 of a[2i] (first half) and a[2i + 1]
    s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                          _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // + 4
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // + 2, within each 128-bit lane
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * i], s4[2 * i + 1], 0x44),
                          _mm512_shuffle_ps(s4[2 * i], s4[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xDD));  // + 1
}

// The tile of the AVX-512 body: bf16 pairs of a weight row and a row of x multiplied into float32 sums
// (vdpbf16ps), 32 columns a step, K's last K % 32 columns masked.
template <int R, int G, int Prefetch>
__attribute__((always_inline)) static inline void bf16_tile(const uint16_t* x, int64_t ldx, const uint16_t* w,
                                                            uint16_t* y, const float* bias, int64_t K, int64_t N,
                                                            int64_t n) {
  const uint16_t* wr = w + n * K;
  const int64_t k32 = K / 32 * 32;
  const char* pf = reinterpret_cast<const char*>(wr + R * K) + kTileAhead;
  __m512 a[R][G];
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) a[r][g] = _mm512_setzero_ps();
  auto step = [&](const __m512bh* wv, auto load_x) __attribute__((always_inline)) {
    _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) {
      const __m512bh xv = load_x(g);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) a[r][g] = _mm512_dpbf16_ps(a[r][g], wv[r], xv);
    }
  };
  _Pragma("GCC unroll 4") for (int64_t k = 0; k < k32; k += 32) {
    if constexpr (Prefetch == kPrefetchTile) prefetch_tile<R, G>(pf);
    if constexpr (Prefetch == kPrefetchStream) prefetch_l2(reinterpret_cast<const char*>(wr + k) + kStreamAhead);
    __m512bh wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(wr + r * K + k);
    step(wv, [&](int g) __attribute__((always_inline)) { return (__m512bh)_mm512_loadu_si512(x + g * ldx + k); });
  }
  if (K > k32) {
    const __mmask32 tail = static_cast<__mmask32>((1ull << (K - k32)) - 1);
    __m512bh wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, wr + r * K + k32);
    step(wv, [&](int g) __attribute__((always_inline)) { return (__m512bh)_mm512_maskz_loadu_epi16(tail, x + g * ldx + k32); });
  }
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g)
    y[g * N + n + r] = out(hsum(a[r][g]), bias, n + r);
}

// Rows [n0, n1) of W against M rows of x, two weight rows at a time (an odd last one alone), every row of x
// in the one tile (up to 16 accumulators, 2 weight vectors and one of x on 32 registers). All of
// SmolLM2-135M's matrices in one huge-page arena, 2-core Xeon (Sapphire Rapids, AMX, 480 MiB L3), 1 thread,
// median of 7 sweeps alternating with the body before (one weight row at a time, 4 accumulators per row of
// x, every line of the row prefetched 4 KiB ahead; scripts/bf16_rows_ab.sh e41aa66 7 with
// CXXFLAGS=-march=native, load 0.4-0.7): 1 row 0.66x its time, 2 rows 0.67x, 3 0.57x, 4 0.56x, 5 0.60x,
// 8 0.78x; 4 rows now 1.02x one row's time (1.20x before). Tiles of 3 or 4 weight rows ran 1-15 % slower
// at 1-4 rows, one weight row 3-15 % slower, 8 rows as two tiles of 4 (re-reading the weights from cache)
// 10 % slower.
template <int M>
static void bf16_rows(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K, int64_t N,
                      int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) bf16_tile<2, M, kPrefetchTile>(x, K, w, y, bias, K, N, n);
  if (n < n1) bf16_tile<1, M, kNoPrefetch>(x, K, w, y, bias, K, N, n);
}

// kBf16Rows, kBf16Stream: one weight row after the other, every row of x in the one tile.
template <int M, int Prefetch = kNoPrefetch>
static void bf16_rows_seq(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K,
                          int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) bf16_tile<1, M, Prefetch>(x, K, w, y, bias, K, N, n);
}

// Many rows of x (a prompt's), W in cache (bf16_rows_any's blocks): 4 weight rows against 4 rows of x, the 16
// sums taken together (hsum16), each in bf16_tile's order. On a Zen 4, a block of 240 rows against a layer of
// SmolLM2-135M, 1 thread: 106 GFLOP/s, where the 2 x 8 tile with a sum per pair ran 77 (a busy machine,
// alternating).
static void bf16_tile4x4(const uint16_t* x, int64_t ldx, const uint16_t* w, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t n) {
  const uint16_t* wr = w + n * K;
  const int64_t k32 = K / 32 * 32;
  __m512 a[16];
  for (auto& v : a) v = _mm512_setzero_ps();
  auto step = [&](const __m512bh* wv, auto load_x) __attribute__((always_inline)) {
    _Pragma("GCC unroll 4") for (int g = 0; g < 4; ++g) {
      const __m512bh xv = load_x(g);
      _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) a[g * 4 + r] = _mm512_dpbf16_ps(a[g * 4 + r], wv[r], xv);
    }
  };
  for (int64_t k = 0; k < k32; k += 32) {
    __m512bh wv[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(wr + r * K + k);
    step(wv, [&](int g) __attribute__((always_inline)) { return (__m512bh)_mm512_loadu_si512(x + g * ldx + k); });
  }
  if (K > k32) {
    const __mmask32 tail = static_cast<__mmask32>((1ull << (K - k32)) - 1);
    __m512bh wv[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, wr + r * K + k32);
    step(wv, [&](int g) __attribute__((always_inline)) { return (__m512bh)_mm512_maskz_loadu_epi16(tail, x + g * ldx + k32); });
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, hsum16(a));
  for (int g = 0; g < 4; ++g)
    for (int r = 0; r < 4; ++r) y[g * N + n + r] = out(sums[4 * r + g], bias, n + r);  // a[g*4+r] at lane 4r+g
}

// Rows [n0, n1) of W against 4 rows of x (bf16_rows_any's blocked path).
static void bf16_rows_x4(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K, int64_t N,
                         int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) bf16_tile4x4(x, K, w, y, bias, K, N, n);
  for (; n < n1; ++n) bf16_tile<1, 4, kNoPrefetch>(x, K, w, y, bias, K, N, n);
}
#define INFERLAB_BF16_X4 1
#elif defined(INFERLAB_SIMD8)
// x (M, K) bf16 -> float32, once per call, into this thread's buffer (kept between calls).
static inline const float* widen_rows(const uint16_t* x, int64_t n) {
  thread_local std::vector<float> xf;
  if (static_cast<int64_t>(xf.size()) < n) xf.resize(n);
  for (int64_t i = 0; i < n; ++i) xf[i] = bf16_to_float(x[i]);
  return xf.data();
}

// The tile of the AVX2 and NEON bodies: weights widened to float32 eight at a time, x already float32,
// fused multiply-adds; K's last K % 8 columns in plain C++.
template <int R, int G, int Prefetch>
__attribute__((always_inline)) static inline void bf16_tile(const float* xf, int64_t ldx, const uint16_t* w,
                                                            uint16_t* y, const float* bias, int64_t K, int64_t N,
                                                            int64_t n) {
  using namespace s8;
  const uint16_t* wr = w + n * K;
  const int64_t k8 = K / 8 * 8;
  const char* pf = reinterpret_cast<const char*>(wr + R * K) + kTileAhead;
  vf a[R][G];
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) a[r][g] = zero();
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    vf wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = load_bf16(wr + r * K + k);
    _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) {
      const vf xv = load(xf + g * ldx + k);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) a[r][g] = fma(wv[r], xv, a[r][g]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= k8; k += 32) {
    if constexpr (Prefetch == kPrefetchTile) prefetch_tile<R, G>(pf);
    if constexpr (Prefetch == kPrefetchStream) prefetch_l2(reinterpret_cast<const char*>(wr + k) + kStreamAhead);
    step(k);
    step(k + 8);
    step(k + 16);
    step(k + 24);
  }
  for (; k < k8; k += 8) step(k);
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) {
    float sum = hsum(a[r][g]);
    for (int64_t j = k8; j < K; ++j) sum += bf16_to_float(wr[r * K + j]) * xf[g * ldx + j];
    y[g * N + n + r] = out(sum, bias, n + r);
  }
}

// Rows [n0, n1) of W against M rows of x, R weight rows at a time (the rest one at a time), rows of x up to
// 4 per tile (R * G accumulators + R weight vectors + one of x on 16 registers); 5-8 rows of x in two tiles
// (3 + 2, 3 + 3, 4 + 3, 4 + 4), the second reading the same weight rows again from cache. R per M: 3 weight
// rows, but 4 for 2 rows of x (4 for one row lost at K = 1536). All of SmolLM2-135M's matrices in one
// huge-page arena, AVX2 flags on a Zen 4, 1 thread, median of 11 sweeps alternating with the body before
// (4 accumulators per row, one weight row at a time; scripts/bf16_rows_ab.sh de71073 11, load 0.7): 1 row
// 1.01x its time, 2 rows 0.89x, 3 rows 0.70x, 4 rows 0.59x, 8 rows 0.75x; 4 rows now 1.50x one row's time
// (2.59x before).
template <int M>
static void bf16_rows(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K, int64_t N,
                      int64_t n0, int64_t n1) {
  const float* xf = widen_rows(x, M * K);
  constexpr int R = M == 2 ? 4 : 3;
  constexpr int G1 = M <= 4 ? M : (M + 1) / 2, G2 = M - G1;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    bf16_tile<R, G1, kPrefetchTile>(xf, K, w, y, bias, K, N, n);
    if constexpr (G2 > 0) bf16_tile<R, G2, kNoPrefetch>(xf + G1 * K, K, w, y + G1 * N, bias, K, N, n);
  }
  for (; n < n1; ++n) {
    bf16_tile<1, G1, kNoPrefetch>(xf, K, w, y, bias, K, N, n);
    if constexpr (G2 > 0) bf16_tile<1, G2, kNoPrefetch>(xf + G1 * K, K, w, y + G1 * N, bias, K, N, n);
  }
}

// kBf16Rows: one weight row after the other (its two tiles of x rows read it from L1 the second time).
template <int M, int Prefetch = kNoPrefetch>
static void bf16_rows_seq(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K,
                          int64_t N, int64_t n0, int64_t n1) {
  const float* xf = widen_rows(x, M * K);
  constexpr int G1 = M <= 4 ? M : (M + 1) / 2, G2 = M - G1;
  for (int64_t n = n0; n < n1; ++n) {
    bf16_tile<1, G1, Prefetch>(xf, K, w, y, bias, K, N, n);
    if constexpr (G2 > 0) bf16_tile<1, G2, kNoPrefetch>(xf + G1 * K, K, w, y + G1 * N, bias, K, N, n);
  }
}
#else
template <int M>
static void bf16_rows(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K, int64_t N,
                      int64_t n0, int64_t n1) {
  std::vector<float> xf(M * K);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = bf16_to_float(x[i]);
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wr = w + n * K;
    for (int m = 0; m < M; ++m) {
      const float* xr = xf.data() + m * K;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < K; ++k) acc += bf16_to_float(wr[k]) * xr[k];
      y[m * N + n] = out(acc, bias, n);
    }
  }
}
template <int M, int Prefetch = kNoPrefetch>
static void bf16_rows_seq(const uint16_t* x, const uint16_t* w, uint16_t* y, const float* bias, int64_t K,
                          int64_t N, int64_t n0, int64_t n1) {
  bf16_rows<M>(x, w, y, bias, K, N, n0, n1);  // one weight row at a time already
}
#endif

using RowsFn = void (*)(const uint16_t*, const uint16_t*, uint16_t*, const float*, int64_t, int64_t, int64_t,
                         int64_t);
static RowsFn bf16_rows_for(int64_t m, int body = -1) {
  static const RowsFn tiles[kMaxRows] = {bf16_rows<1>, bf16_rows<2>, bf16_rows<3>, bf16_rows<4>,
                                         bf16_rows<5>, bf16_rows<6>, bf16_rows<7>, bf16_rows<8>};
  static const RowsFn rows[kMaxRows] = {bf16_rows_seq<1>, bf16_rows_seq<2>, bf16_rows_seq<3>, bf16_rows_seq<4>,
                                        bf16_rows_seq<5>, bf16_rows_seq<6>, bf16_rows_seq<7>, bf16_rows_seq<8>};
  constexpr int S = kPrefetchStream;
  static const RowsFn stream[kMaxRows] = {bf16_rows_seq<1, S>, bf16_rows_seq<2, S>, bf16_rows_seq<3, S>,
                                          bf16_rows_seq<4, S>, bf16_rows_seq<5, S>, bf16_rows_seq<6, S>,
                                          bf16_rows_seq<7, S>, bf16_rows_seq<8, S>};
  if (body < 0) body = g_bf16_body.load(std::memory_order_relaxed);
  return (body == kBf16Stream ? stream : body == kBf16Rows ? rows : tiles)[m - 1];
}

// Any number M of rows of x (a prompt's rows where bf16 is emulated, a large decode batch): blocks of
// kRowBlock weight rows, each block against every chunk of up to 8 rows of x while it is in cache, so the
// weights come from memory once per call, not once per chunk. Each output is the one an 8-row chunk's call
// gives (every body sums each row as the row alone, and a weight row's result does not depend on the range
// it is called in), so a row's result never depends on M or on how rows were chunked.
static constexpr int64_t kRowBlock = 64;  // 74 KiB of bf16 weights at K = 576, 192 KiB at K = 1536: in L2
static void bf16_rows_any(const uint16_t* x, int64_t M, const uint16_t* w, uint16_t* y, const float* bias, int64_t K,
                          int64_t N, int64_t n0, int64_t n1) {
  if (M <= kMaxRows) return bf16_rows_for(M)(x, w, y, bias, K, N, n0, n1);
#ifdef INFERLAB_BF16_X4
  constexpr int64_t chunk = 4;  // the 4 x 4 tile (bf16_rows_x4); the last M % 4 rows as their own call
#else
  constexpr int64_t chunk = kMaxRows;
#endif
  for (int64_t nb = n0; nb < n1; nb += kRowBlock) {
    const int64_t ne = std::min(n1, nb + kRowBlock);
    for (int64_t m = 0; m < M; m += chunk) {
      const int64_t rows = std::min(chunk, M - m);
#ifdef INFERLAB_BF16_X4
      if (rows == 4) {
        bf16_rows_x4(x + m * K, w, y + m * N, bias, K, N, nb, ne);
        continue;
      }
#endif
      bf16_rows_for(rows, kBf16Tiles)(x + m * K, w, y + m * N, bias, K, N, nb, ne);
    }
  }
}

// ---------------------------------------------------------------------------------------------- int4
// Per row of x, once per call: its columns reordered to match two chunks unpacked side by side
// ([c0 0..15, c1 0..15 | c0 16..31, c1 16..31], for the AVX-512 body), and per group g the pair
// (-136 * X_g, X_g) with X_g the sum of x over the group, so that a row's constant term
//     sum_g (zero_g - 136 scale_g) X_g
// is one dot product of those pairs with the row's interleaved (scale, zero) table.
static void prepare_x(const uint16_t* x, int64_t K, int64_t group, float* gx, uint16_t* xperm) {
  for (int64_t g = 0; g < K / group; ++g) {
    float s = 0.f;
    for (int64_t j = 0; j < group; ++j) s += bf16_to_float(x[g * group + j]);
    gx[2 * g] = -136.f * s;
    gx[2 * g + 1] = s;
  }
  for (int64_t p = 0; p < K / 64; ++p) {
    const uint16_t* c0 = x + p * 64;
    const uint16_t* c1 = c0 + 32;
    uint16_t* o = xperm + p * 64;
    std::memcpy(o, c0, 32);
    std::memcpy(o + 16, c1, 32);
    std::memcpy(o + 32, c0 + 16, 32);
    std::memcpy(o + 48, c1 + 16, 32);
  }
}

// Rows [n0, n1) of the codes against T rows of x. sz: (N, groups, 2) bf16 (scale, zero).
template <int T>
static void int4_rows(const uint16_t* xperm, const float* gx, const uint8_t* codes, const uint16_t* sz,
                      const uint16_t* x, uint16_t* y, const float* bias, int64_t K, int64_t N, int64_t group,
                      int64_t n0, int64_t n1) {
  const int64_t groups = K / group, pairs = 2 * groups;
  const int shift = log2_exact(group / 32);  // chunk index -> group index (group sizes are powers of two)
  std::vector<float> szf(pairs + 16);  // this row's (scale, zero) table in float32
#ifdef INFERLAB_SIMD8
  const float* xf = widen_rows(x, T * K);
#endif
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = codes + n * (K / 2);
    const uint16_t* szr = sz + n * pairs;
    float constant[T] = {};
#ifdef INFERLAB_AVX512_BF16
    (void)x;
    {  // the (scale, zero) table to float32, and its dot products with each row's (-136 X_g, X_g)
      __m512 c[T];
      for (int t = 0; t < T; ++t) c[t] = _mm512_setzero_ps();
      for (int64_t j = 0; j < pairs; j += 16) {
        const __mmask16 m = pairs - j >= 16 ? static_cast<__mmask16>(0xFFFF)
                                            : static_cast<__mmask16>((1u << (pairs - j)) - 1);
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, szr + j));
        const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
        _mm512_storeu_ps(szf.data() + j, f);
        for (int t = 0; t < T; ++t) c[t] = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(m, gx + t * pairs + j), c[t]);
      }
      for (int t = 0; t < T; ++t) constant[t] = _mm512_reduce_add_ps(c[t]);
    }
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi16(0x0F), magic = _mm512_set1_epi16(0x4300);
    for (int64_t p = 0; p < K / 64; ++p) {  // two chunks (64 columns, 32 bytes) per iteration
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 32)));
      const __m512bh lo = (__m512bh)_mm512_or_si512(_mm512_and_si512(b, low), magic);
      const __m512bh hi = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(b, 4), magic);
      const float s0 = szf[2 * ((2 * p) >> shift)], s1 = szf[2 * ((2 * p + 1) >> shift)];
      const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
      for (int t = 0; t < T; ++t) {
        const uint16_t* xp = xperm + t * K + p * 64;
        __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), lo, (__m512bh)_mm512_loadu_si512(xp));
        d = _mm512_dpbf16_ps(d, hi, (__m512bh)_mm512_loadu_si512(xp + 32));
        acc[t] = _mm512_fmadd_ps(d, scale, acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[t * N + n] = out(_mm512_reduce_add_ps(acc[t]) + constant[t], bias, n);
#elif defined(INFERLAB_SIMD8)
    (void)xperm;
    using namespace s8;
    for (int64_t j = 0; j < pairs; ++j) szf[j] = bf16_to_float(szr[j]);
    for (int t = 0; t < T; ++t)  // (zero - 8 scale) X_g, X_g the group's sum of x (gx's odd entries)
      for (int64_t g = 0; g < groups; ++g) constant[t] += (szf[2 * g + 1] - 8.f * szf[2 * g]) * gx[t * pairs + 2 * g + 1];
    vf acc[T];
    for (int t = 0; t < T; ++t) acc[t] = zero();
    for (int64_t c = 0; c < K / 32; ++c) {  // chunk c: columns c*32 + j (low nibbles), + 16 (high)
      if ((c & 3) == 0) prefetch(row + c * 16);
      vf q[4];
      load_nibbles(row + c * 16, q);
      const vf sc = set1(szf[2 * (c >> shift)]);
      for (int t = 0; t < T; ++t) {
        const float* xr = xf + t * K + c * 32;
        vf d = mul(q[0], load(xr));
        d = fma(q[1], load(xr + 8), d);
        d = fma(q[2], load(xr + 16), d);
        d = fma(q[3], load(xr + 24), d);
        acc[t] = fma(d, sc, acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[t * N + n] = out(hsum(acc[t]) + constant[t], bias, n);
#else
    (void)xperm;
    for (int64_t j = 0; j < pairs; ++j) szf[j] = bf16_to_float(szr[j]);
    for (int t = 0; t < T; ++t) {
      for (int64_t j = 0; j < pairs; ++j) constant[t] += szf[j] * gx[t * pairs + j];
      const uint16_t* xr = x + t * K;
      float acc = 0.f;
      for (int64_t c = 0; c < K / 32; ++c) {
        float d = 0.f;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = row[c * 16 + j];
          d += (128.f + (byte & 0x0F)) * bf16_to_float(xr[c * 32 + j]);
          d += (128.f + (byte >> 4)) * bf16_to_float(xr[c * 32 + 16 + j]);
        }
        acc += szf[2 * (c >> shift)] * d;
      }
      y[t * N + n] = out(acc + constant[t], bias, n);
    }
#endif
  }
}

#ifdef INFERLAB_AVX512_BF16
// One row of x, four output rows at a time: four independent accumulator chains (one row alone waits
// on its own multiply-add latency), the x loads shared. The tail rows go through int4_rows<1>.
static void int4_rows_x4(const uint16_t* xperm, const float* gx, const uint8_t* codes, const uint16_t* sz,
                         const uint16_t* x, uint16_t* y, const float* bias, int64_t K, int64_t N, int64_t group,
                         int64_t n0, int64_t n1) {
  const int64_t groups = K / group, pairs = 2 * groups, stride = pairs + 16;
  const int shift = log2_exact(group / 32);
  std::vector<float> szf(4 * stride);
  const __m512i low = _mm512_set1_epi16(0x0F), magic = _mm512_set1_epi16(0x4300);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    float constant[4];
    for (int r = 0; r < 4; ++r) {
      const uint16_t* szr = sz + (n + r) * pairs;
      float* f32 = szf.data() + r * stride;
      __m512 c = _mm512_setzero_ps();
      for (int64_t j = 0; j < pairs; j += 16) {
        const __mmask16 m = pairs - j >= 16 ? static_cast<__mmask16>(0xFFFF)
                                            : static_cast<__mmask16>((1u << (pairs - j)) - 1);
        const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, szr + j)), 16));
        _mm512_storeu_ps(f32 + j, f);
        c = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(m, gx + j), c);
      }
      constant[r] = _mm512_reduce_add_ps(c);
    }
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t p = 0; p < K / 64; ++p) {
      const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xperm + p * 64);
      const __m512bh x1 = (__m512bh)_mm512_loadu_si512(xperm + p * 64 + 32);
      const int64_t g0 = 2 * ((2 * p) >> shift), g1 = 2 * ((2 * p + 1) >> shift);
      for (int r = 0; r < 4; ++r) {
        const uint8_t* row = codes + (n + r) * (K / 2) + p * 32;
        prefetch(row);
        const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
        const __m512bh lo = (__m512bh)_mm512_or_si512(_mm512_and_si512(b, low), magic);
        const __m512bh hi = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(b, 4), magic);
        const float* f32 = szf.data() + r * stride;
        const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(f32[g0]), _mm256_set1_ps(f32[g1]), 1);
        const __m512 d = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), lo, x0), hi, x1);
        acc[r] = _mm512_fmadd_ps(d, scale, acc[r]);
      }
    }
    for (int r = 0; r < 4; ++r) y[n + r] = out(_mm512_reduce_add_ps(acc[r]) + constant[r], bias, n + r);
  }
  if (n < n1) int4_rows<1>(xperm, gx, codes, sz, x, y, bias, K, N, group, n, n1);
}
#endif

using Int4Fn = void (*)(const uint16_t*, const float*, const uint8_t*, const uint16_t*, const uint16_t*, uint16_t*,
                        const float*, int64_t, int64_t, int64_t, int64_t, int64_t);

// The two halves of the raw entry (the fused decode step runs them on each thread: the preparation of x,
// then its share of the output rows). Scratch gx (M * 2 * K / group floats) and xperm (M * K values).
static void int4_prepare(const uint16_t* xp, int64_t M, int64_t K, int64_t group, float* gx, uint16_t* xperm) {
  const int64_t pairs = 2 * (K / group);
  for (int64_t m = 0; m < M; ++m) prepare_x(xp + m * K, K, group, gx + m * pairs, xperm + m * K);
}

static void int4_range(const uint16_t* xp, int64_t M, const uint8_t* cp, const uint16_t* szp, int64_t group,
                       const float* bp, int64_t K, int64_t N, uint16_t* yp, const float* gx, const uint16_t* xperm,
                       int64_t n0, int64_t n1) {
  const int64_t pairs = 2 * (K / group);
  static const Int4Fn table[kTile] = {int4_rows<1>, int4_rows<2>, int4_rows<3>, int4_rows<4>};
  for (int64_t m0 = 0; m0 < M; m0 += kTile) {
    const int64_t t = std::min(kTile, M - m0);
    Int4Fn rows = table[t - 1];
#ifdef INFERLAB_AVX512_BF16
    if (t == 1) rows = int4_rows_x4;
#endif
    rows(xperm + m0 * K, gx + m0 * pairs, cp, szp, xp + m0 * K, yp + m0 * N, bp, K, N, group, n0, n1);
  }
}

// ---------------------------------------------------------------------------------------------- int8
// W as int8 rows with one scale each (w = scale * q): y = scale * (q . x). x widened to float32 once.
template <int M>
static void int8_rows(const float* xf, const int8_t* q, const uint16_t* scales, uint16_t* y, const float* bias,
                      int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    float dot[M];
#ifdef INFERLAB_AVX512_BF16
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = K - k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (K - k)) - 1);
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row + k)));
      for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mask, xf + m * K + k), acc[m]);
    }
    for (int m = 0; m < M; ++m) dot[m] = _mm512_reduce_add_ps(acc[m]);
#elif defined(INFERLAB_SIMD8)
    using namespace s8;
    const int64_t kv = K / 8 * 8;
    vf acc[M];
    for (int m = 0; m < M; ++m) acc[m] = zero();
    for (int64_t k = 0; k < kv; k += 8) {
      if ((k & 63) == 0) prefetch(row + k);
      const vf w = load_i8(row + k);
      for (int m = 0; m < M; ++m) acc[m] = fma(w, load(xf + m * K + k), acc[m]);
    }
    for (int m = 0; m < M; ++m) {
      dot[m] = hsum(acc[m]);
      for (int64_t k = kv; k < K; ++k) dot[m] += static_cast<float>(row[k]) * xf[m * K + k];
    }
#else
    for (int m = 0; m < M; ++m) {
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < K; ++k) acc += static_cast<float>(row[k]) * xf[m * K + k];
      dot[m] = acc;
    }
#endif
    const float s = bf16_to_float(scales[n]);
    for (int m = 0; m < M; ++m) y[m * N + n] = out(s * dot[m], bias, n);
  }
}

#ifdef INFERLAB_AVX512_BF16
// One row of x, four output rows at a time (independent chains, shared x loads); tail via int8_rows<1>.
static void int8_rows_x4(const float* xf, const int8_t* q, const uint16_t* scales, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = K - k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (K - k)) - 1);
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xf + k);
      for (int r = 0; r < 4; ++r) {
        prefetch(q + (n + r) * K + k);
        const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, q + (n + r) * K + k)));
        acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
      }
    }
    for (int r = 0; r < 4; ++r) y[n + r] = out(bf16_to_float(scales[n + r]) * _mm512_reduce_add_ps(acc[r]), bias, n + r);
  }
  if (n < n1) int8_rows<1>(xf, q, scales, y, bias, K, N, n, n1);
}
#endif

// The two halves of the raw entry (as int4_prepare / int4_range): x (M, K) bf16 with M <= 8 widened to
// xf (M * K floats), then rows [n0, n1).
static void int8_prepare(const uint16_t* x, int64_t M, int64_t K, float* xf) {
  for (int64_t i = 0; i < M * K; ++i) xf[i] = bf16_to_float(x[i]);
}

static void int8_range(const float* xf, int64_t M, const int8_t* qp, const uint16_t* sp, const float* bp,
                       int64_t K, int64_t N, uint16_t* yp, int64_t n0, int64_t n1) {
  using Fn = void (*)(const float*, const int8_t*, const uint16_t*, uint16_t*, const float*, int64_t, int64_t,
                      int64_t, int64_t);
  static const Fn table[kMaxRows] = {int8_rows<1>, int8_rows<2>, int8_rows<3>, int8_rows<4>,
                                         int8_rows<5>, int8_rows<6>, int8_rows<7>, int8_rows<8>};
  Fn rows = table[M - 1];
#ifdef INFERLAB_AVX512_BF16
  if (M == 1) rows = int8_rows_x4;
#endif
  rows(xf, qp, sp, yp, bp, K, N, n0, n1);
}

// ------------------------------------------------------------------- int8 activations (Q8, VNNI)
// The 4-bit and 8-bit products with the activation row quantized once per call to int8, one float scale
// per block of 32 columns (as llama.cpp's Q8 activations): x_k ~ d_b * xq_k. Integer products of codes
// and xq (vpdpbusd: 64 byte pairs per instruction, where the CPU has AVX-512 VNNI; plain C++ elsewhere,
// the same arithmetic) replace the bf16 products: fewer instructions per weight, so the few cores of a
// decode keep up with the memory. The cost is x's rounding to 8 bits (the tests and `quant quality`
// measure it); the float bodies above stay the exact path.
//
//   int4:  sum_k w_k x_k = sum_g [ scale_g * sum_{b in g} d_b * sum_{k in b} q_k xq_k ] + (zero_g - 8 scale_g) X_g
//          with X_g = sum_{b in g} d_b sum_{k in b} xq_k (x as rounded: the result is exactly the weights
//          times the rounded row, as llama.cpp's Q4_1 x Q8_1).
//   int8:  sum_k w_k x_k = s_n * sum_b d_b * sum_{k in b} w_k xq_k; vpdpbusd multiplies unsigned by signed
//          bytes, so the weights go in as w + 128 (one xor) and 128 * sum_b d_b sum_{k in b} xq_k is taken off.
static constexpr int64_t kQBlock = 32;

// Hands out consecutive pieces of one caller-owned float scratch (no allocation per call).
struct Carve {
  float* f;
  float* take(int64_t n) {
    float* p = f;
    f += n;
    return p;
  }
};

// x (K,) bf16 -> xq (K,) int8 and d (ceil(K / 32),) with x_k ~ d_b xq_k; returns nothing.
static void quantize_row_q8(const uint16_t* x, int64_t K, int8_t* xq, float* d) {
  for (int64_t b = 0; b * kQBlock < K; ++b) {
    const int64_t k0 = b * kQBlock, k1 = std::min(K, k0 + kQBlock);
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(bf16_to_float(x[k])));
    const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    d[b] = scale;
    for (int64_t k = k0; k < k1; ++k) xq[k] = static_cast<int8_t>(std::nearbyint(bf16_to_float(x[k]) * inv));
  }
}

// Per row of x for the int4 body: its int8 values in the order a 64-byte load of codes unpacks to
// (per 128 columns: [chunk c's columns 0..15 for c = 0..3] then [chunk c's 16..31]; a last half block
// zero-padded), the block scales spread to match (16 floats per 128 columns: lane i has chunk i / 4's
// scale), and per 128 columns the pairs (-8 X_g, X_g) of the groups there (8 floats, zero-padded), X_g
// the sum of x over group g as rounded (sum d_b xq_k: with the exact sum, the codes' offset of 8 would
// not cancel and x's rounding would count ~8 times over): the zero term of the groups is then one 8-lane
// product with the row's (scale, zero) pairs of the same columns, in the same pass.
struct Q4x {
  int8_t* xq;  // ceil(K / 128) * 128 bytes
  float* dv;   // ceil(K / 128) * 16 floats
  float* gxv;  // ceil(K / 128) * 8 floats
};

// Per row of x for the int8 body: xq zero-padded to whole 64-byte loads, the block scales spread over
// 16 lanes per 64 columns (lanes 0-7: the first block, 8-15: the second), and 128 * sum_b d_b sum xq_b.
struct Q8x {
  int8_t* xq;
  float* dv;
  float offset;
};

// Groups whose (scale, zero) pairs one 128-column block of a row holds, and the first one's index.
static inline int64_t q4_groups_in_block(int64_t p, int64_t groups, int shift) {
  const int64_t per = shift >= 2 ? 1 : (4 >> shift);
  return std::min(per, groups - ((4 * p) >> shift));
}

static void prepare_q4x(const uint16_t* x, int64_t K, int64_t group, int8_t* tmp, float* dtmp, Q4x o) {
  quantize_row_q8(x, K, tmp, dtmp);
  const int64_t blocks = (K + 127) / 128, groups = K / group;
  const int shift = log2_exact(group / 32);
  std::memset(o.xq, 0, blocks * 128);
  for (int64_t p = 0; p < blocks; ++p)
    for (int c = 0; c < 4 && p * 128 + c * 32 < K; ++c) {
      std::memcpy(o.xq + p * 128 + c * 16, tmp + p * 128 + c * 32, 16);
      std::memcpy(o.xq + p * 128 + 64 + c * 16, tmp + p * 128 + c * 32 + 16, 16);
    }
  for (int64_t p = 0; p < blocks; ++p) {
    for (int i = 0; i < 16; ++i) {
      const int64_t chunk = p * 4 + i / 4;
      o.dv[p * 16 + i] = chunk * 32 < K ? dtmp[chunk] : 0.f;
    }
    const int64_t g0 = (4 * p) >> shift, ng = q4_groups_in_block(p, groups, shift);
    for (int j = 0; j < 4; ++j) {
      float sum = 0.f;
      if (j < ng)  // the sum of x as rounded (d_b xq_k), so the zero term cancels the codes' offset exactly
        for (int64_t k = (g0 + j) * group; k < (g0 + j + 1) * group; ++k) sum += dtmp[k / kQBlock] * tmp[k];
      o.gxv[p * 8 + 2 * j] = -8.f * sum;
      o.gxv[p * 8 + 2 * j + 1] = sum;
    }
  }
}

#ifdef INFERLAB_SIMD8
#include "linear_q8_simd.h"  // the AVX2 and NEON bodies of int4_rows_q8, int8_rows_q8
#else
#ifdef INFERLAB_AVX512_VNNI
// One 128-column block of one code row against the prepared x rows: integer dot products per chunk,
// scaled by (row scale x block scale) into acc; the block's zero terms into cacc (8 lanes).
template <int T>
static inline void q4_block(const uint8_t* row, const uint16_t* szr, const Q4x* xs, int64_t p, int64_t K,
                            int64_t groups, int shift, __m512i idx, __m512* acc, __m256* cacc) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t bytes = std::min<int64_t>(64, K / 2 - p * 64);
  const __mmask64 m = bytes == 64 ? ~0ull : (1ull << bytes) - 1;
  const __m512i b = _mm512_maskz_loadu_epi8(m, row + p * 64);
  const __m512i lo = _mm512_and_si512(b, low), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
  const int64_t g0 = (4 * p) >> shift;
  const __mmask8 pm = static_cast<__mmask8>((1u << (2 * q4_groups_in_block(p, groups, shift))) - 1);
  const __m256 fz = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(pm, szr + 2 * g0)), 16));
  const __m512 sv = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(fz));
  for (int t = 0; t < T; ++t) {
    const int8_t* xq = xs[t].xq + p * 128;
    __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
    dp = _mm512_dpbusd_epi32(dp, hi, _mm512_loadu_si512(xq + 64));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(sv, _mm512_loadu_ps(xs[t].dv + p * 16)), acc[t]);
    cacc[t] = _mm256_fmadd_ps(fz, _mm256_loadu_ps(xs[t].gxv + p * 8), cacc[t]);
  }
}

// The sum of 8 float lanes.
static inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#endif

// Rows [n0, n1) of the codes against T rows of x prepared by prepare_q4x.
template <int T>
static void int4_rows_q8(const Q4x* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t groups = K / group, pairs = 2 * groups, blocks = (K + 127) / 128;
  const int shift = log2_exact(group / 32);
#ifdef INFERLAB_AVX512_VNNI
  alignas(64) int32_t idx_arr[16];
  for (int i = 0; i < 16; ++i) idx_arr[i] = 2 * ((i / 4) >> shift);
  const __m512i idx = _mm512_load_si512(idx_arr);
  int64_t n = n0;
  if (T == 1) {  // one row of x (decode): four code rows at a time, independent chains, x loads shared
    for (; n + 4 <= n1; n += 4) {
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      __m256 cacc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t p = 0; p < blocks; ++p)
        for (int r = 0; r < 4; ++r) {
          prefetch(codes + (n + r) * (K / 2) + p * 64);
          q4_block<1>(codes + (n + r) * (K / 2), sz + (n + r) * pairs, xs, p, K, groups, shift, idx, acc + r, cacc + r);
        }
      for (int r = 0; r < 4; ++r) {
        const float c = hsum8(cacc[r]);
        y[n + r] = out(_mm512_reduce_add_ps(acc[r]) + c, bias, n + r);
      }
    }
  }
  for (; n < n1; ++n) {
    __m512 acc[T];
    __m256 cacc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps(), cacc[t] = _mm256_setzero_ps();
    for (int64_t p = 0; p < blocks; ++p)
      q4_block<T>(codes + n * (K / 2), sz + n * pairs, xs, p, K, groups, shift, idx, acc, cacc);
    for (int t = 0; t < T; ++t)
      y[t * N + n] = out(_mm512_reduce_add_ps(acc[t]) + hsum8(cacc[t]), bias, n);
  }
#else
  std::vector<float> szf(pairs);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = codes + n * (K / 2);
    for (int64_t j = 0; j < pairs; ++j) szf[j] = bf16_to_float(sz[n * pairs + j]);
    for (int t = 0; t < T; ++t) {
      float acc = 0.f, constant = 0.f;
      for (int64_t p = 0; p < blocks; ++p) {
        const int64_t g0 = (4 * p) >> shift, ng = q4_groups_in_block(p, groups, shift);
        for (int j = 0; j < 2 * ng; ++j) constant += szf[2 * g0 + j] * xs[t].gxv[p * 8 + j];
      }
      for (int64_t c = 0; c < K / 32; ++c) {  // chunk c: 16 bytes, columns c*32 + j (low), + 16 (high)
        const int8_t* xq = xs[t].xq + (c / 4) * 128 + (c % 4) * 16;
        int32_t dot = 0;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = row[c * 16 + j];
          dot += (byte & 0x0F) * xq[j] + (byte >> 4) * xq[64 + j];
        }
        acc += szf[2 * (c >> shift)] * xs[t].dv[(c / 4) * 16 + (c % 4) * 4] * static_cast<float>(dot);
      }
      y[t * N + n] = out(acc + constant, bias, n);
    }
  }
#endif
}

#endif  // !INFERLAB_SIMD8

// Scratch, in floats, linear_int4_q8 needs for M rows of K columns (group >= 32).
static int64_t q4_scratch_floats(int64_t M, int64_t K) {
  const int64_t blocks = (K + 127) / 128;
  return blocks * 32 + K / 32 + 8 + M * (blocks * 56 + 8) + 64;
}

// The two halves of linear_int4_q8 (the fused decode step runs them on each thread): M rows of x
// quantized and laid out into xs[0..M) (views into scratch: q4_scratch_floats floats), then rows [n0, n1).
static void int4_q8_prepare(const uint16_t* xp, int64_t M, int64_t K, int64_t group, float* scratch, Q4x* xs) {
  const int64_t blocks = (K + 127) / 128;
  Carve c{scratch};
  int8_t* tmp = reinterpret_cast<int8_t*>(c.take(blocks * 32));  // K int8 (blocks * 128 bytes)
  float* dtmp = c.take(K / 32 + 8);
  for (int64_t m = 0; m < M; ++m) {
    xs[m] = {reinterpret_cast<int8_t*>(c.take(blocks * 32)), c.take(blocks * 16), c.take(blocks * 8)};
    prepare_q4x(xp + m * K, K, group, tmp, dtmp, xs[m]);
  }
}

static void int4_q8_range(const Q4x* xs, int64_t M, const uint8_t* cp, const uint16_t* szp, int64_t group,
                          const float* bp, int64_t K, int64_t N, uint16_t* yp, int64_t n0, int64_t n1) {
  using Fn = void (*)(const Q4x*, const uint8_t*, const uint16_t*, uint16_t*, const float*, int64_t, int64_t,
                      int64_t, int64_t, int64_t);
  static const Fn table[kTile] = {int4_rows_q8<1>, int4_rows_q8<2>, int4_rows_q8<3>, int4_rows_q8<4>};
  for (int64_t m0 = 0; m0 < M; m0 += kTile)
    table[std::min(kTile, M - m0) - 1](xs + m0, cp, szp, yp + m0 * N, bp, K, N, group, n0, n1);
}

#ifndef INFERLAB_SIMD8
template <int M>
static void int8_rows_q8(const Q8x* xs, const int8_t* q, const uint16_t* scales, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t blocks = (K + 63) / 64;
  int64_t n = n0;
#ifdef INFERLAB_AVX512_VNNI
  if (M == 1) {  // one row of x (decode): four weight rows at a time, independent chains, x loads shared
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (; n + 4 <= n1; n += 4) {
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t p = 0; p < blocks; ++p) {
        const int64_t bytes = std::min<int64_t>(64, K - p * 64);
        const __mmask64 mk = bytes == 64 ? ~0ull : (1ull << bytes) - 1;
        const __m512i xv = _mm512_loadu_si512(xs[0].xq + p * 64);
        const __m512 dv = _mm512_loadu_ps(xs[0].dv + p * 16);
        for (int r = 0; r < 4; ++r) {
          prefetch(q + (n + r) * K + p * 64);
          const __m512i w = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, q + (n + r) * K + p * 64), flip);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv)), dv, acc[r]);
        }
      }
      for (int r = 0; r < 4; ++r)
        y[n + r] = out(bf16_to_float(scales[n + r]) * (_mm512_reduce_add_ps(acc[r]) - xs[0].offset), bias, n + r);
    }
  }
  if (M > 1 && M <= 4) {  // rows of x in company: two weight rows at a time, each load shared by both (at 5-8
    // rows this measured slower than one weight row at a time: 0.308 vs 0.287 ms, gate_up, 8 rows)
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (; n + 2 <= n1; n += 2) {
      __m512 acc0[M], acc1[M];
      for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
      for (int64_t p = 0; p < blocks; ++p) {
        const int64_t bytes = std::min<int64_t>(64, K - p * 64);
        const __mmask64 mk = bytes == 64 ? ~0ull : (1ull << bytes) - 1;
        prefetch(q + n * K + p * 64);
        prefetch(q + (n + 1) * K + p * 64);
        const __m512i w0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, q + n * K + p * 64), flip);
        const __m512i w1 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, q + (n + 1) * K + p * 64), flip);
        for (int m = 0; m < M; ++m) {
          const __m512i xv = _mm512_loadu_si512(xs[m].xq + p * 64);
          const __m512 dv = _mm512_loadu_ps(xs[m].dv + p * 16);
          acc0[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, xv)), dv, acc0[m]);
          acc1[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, xv)), dv, acc1[m]);
        }
      }
      const float s0 = bf16_to_float(scales[n]), s1 = bf16_to_float(scales[n + 1]);
      for (int m = 0; m < M; ++m) {
        y[m * N + n] = out(s0 * (_mm512_reduce_add_ps(acc0[m]) - xs[m].offset), bias, n);
        y[m * N + n + 1] = out(s1 * (_mm512_reduce_add_ps(acc1[m]) - xs[m].offset), bias, n + 1);
      }
    }
  }
#endif
  for (; n < n1; ++n) {
    const int8_t* row = q + n * K;
    float dot[M];
#ifdef INFERLAB_AVX512_VNNI
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t p = 0; p < blocks; ++p) {
      const int64_t bytes = std::min<int64_t>(64, K - p * 64);
      const __mmask64 mk = bytes == 64 ? ~0ull : (1ull << bytes) - 1;
      // w + 128 as unsigned bytes; masked-off bytes meet zero-padded xq
      const __m512i w = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, row + p * 64), flip);
      for (int m = 0; m < M; ++m) {
        const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(xs[m].xq + p * 64));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_loadu_ps(xs[m].dv + p * 16), acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) dot[m] = _mm512_reduce_add_ps(acc[m]) - xs[m].offset;
#else
    for (int m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t b = 0; b * kQBlock < K; ++b) {
        int32_t s = 0;
        for (int64_t k = b * kQBlock; k < std::min(K, (b + 1) * kQBlock); ++k) s += row[k] * xs[m].xq[k];
        acc += xs[m].dv[(b / 2) * 16 + (b % 2) * 8] * static_cast<float>(s);
      }
      dot[m] = acc;
    }
#endif
    const float s = bf16_to_float(scales[n]);
    for (int m = 0; m < M; ++m) y[m * N + n] = out(s * dot[m], bias, n);
  }
}

#endif  // !INFERLAB_SIMD8

static int64_t q8_scratch_floats(int64_t M, int64_t K) {
  const int64_t blocks = (K + 63) / 64;
  return M * (blocks * 16 + blocks * 16 + 8) + K / 32 + 72;
}

// The two halves of linear_int8_q8 (as int4_q8_prepare / int4_q8_range): M rows of x quantized into
// xs[0..M) (views into scratch: q8_scratch_floats floats), then rows [n0, n1), 8 rows of x a pass.
static void int8_q8_prepare(const uint16_t* x, int64_t M, int64_t K, float* scratch, Q8x* xs) {
  const int64_t blocks = (K + 63) / 64;
  Carve c{scratch};
  float* dtmp = c.take(K / 32 + 8);
  for (int64_t m = 0; m < M; ++m) {
    xs[m].xq = reinterpret_cast<int8_t*>(c.take(blocks * 16));
    xs[m].dv = c.take(blocks * 16);
    std::memset(xs[m].xq, 0, blocks * 64);
    quantize_row_q8(x + m * K, K, xs[m].xq, dtmp);
    float off = 0.f;
    for (int64_t b = 0; b * kQBlock < K; ++b) {
      int32_t s = 0;
      for (int64_t k = b * kQBlock; k < std::min(K, (b + 1) * kQBlock); ++k) s += xs[m].xq[k];
      off += dtmp[b] * static_cast<float>(s);
    }
    xs[m].offset = 128.f * off;
    for (int64_t p = 0; p < blocks; ++p)
      for (int i = 0; i < 16; ++i) {
        const int64_t b = p * 2 + i / 8;
        xs[m].dv[p * 16 + i] = b * kQBlock < K ? dtmp[b] : 0.f;
      }
  }
}

static void int8_q8_range(const Q8x* xs, int64_t M, const int8_t* qp, const uint16_t* sp, const float* bp,
                          int64_t K, int64_t N, uint16_t* yp, int64_t n0, int64_t n1) {
  using Fn = void (*)(const Q8x*, const int8_t*, const uint16_t*, uint16_t*, const float*, int64_t, int64_t,
                      int64_t, int64_t);
  static const Fn table[kMaxRows] = {int8_rows_q8<1>, int8_rows_q8<2>, int8_rows_q8<3>, int8_rows_q8<4>,
                                         int8_rows_q8<5>, int8_rows_q8<6>, int8_rows_q8<7>, int8_rows_q8<8>};
#if defined(INFERLAB_AVX512_VNNI) || defined(INFERLAB_AVX2)
  // passes of at most 4 rows (5-8 rows: two near-equal passes): the two-weight-row loop beats one pass of 5-8
  const int64_t pass = M <= 4 ? M : M <= 8 ? (M + 1) / 2 : 4;
#else
  const int64_t pass = kMaxRows;  // more than 8 rows (prompt rows): passes of 8 over W
#endif
  for (int64_t m0 = 0; m0 < M; m0 += pass)
    table[std::min(pass, M - m0) - 1](xs + m0, qp, sp, yp + m0 * N, bp, K, N, n0, n1);
}

}  // namespace inferlab
