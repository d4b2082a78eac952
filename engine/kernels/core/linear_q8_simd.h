// The int8-activation products (core/linear.h: int4_rows_q8, int8_rows_q8) for the AVX2 and NEON tiers.
// Included by core/linear.h after Q4x / Q8x; the same arithmetic as the AVX-512 VNNI and portable bodies
// there, with each ISA's integer dot product:
//   AVX2: vpmaddubsw (unsigned x signed bytes, adjacent pairs into int16) then vpmaddwd with ones (pairs
//     into int32), as llama.cpp's Q4_1 x Q8_1. 4-bit codes are unsigned already (no saturation: two
//     pairs of 15 * 127 fit int16); for int8 weights the sign moves onto x (|w| * sign(w) x).
//   NEON: sdot (vdotq_s32, four byte products into each int32 lane) where __ARM_FEATURE_DOTPROD, else
//     widening multiplies (vmull_s8) and pairwise adds.
// A chunk's 16 bytes all share one scale, so how lanes group the products within a chunk does not matter.
#pragma once

#ifdef INFERLAB_AVX2
// 8 int32 lanes, each the sum of 4 products of unsigned a and signed b bytes (a <= 15: no saturation)
static inline __m256i dot_u4s8(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}
// The same for signed a: |a| times b with a's sign (|a| <= 128, |b| <= 127: pairs fit int16)
static inline __m256i dot_s8s8(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)),
                           _mm256_set1_epi16(1));
}

// The (scale, zero) pairs of the ng groups in one 128-column block, as float32 lanes (the rest zero).
static inline __m256 q4_pairs(const uint16_t* szr, int64_t ng) {
  __m128i h;
  if (ng >= 4) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(szr));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, szr, 2 * ng * sizeof(uint16_t));
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// One 128-column block (two 64-column halves; the last block of a row may have one) of one code row
// against T prepared x rows: lanes 0-3 of a half are its first chunk, 4-7 its second.
template <int T>
static inline void q4_block(const uint8_t* row, const uint16_t* szr, const Q4x* xs, int64_t p, int64_t K,
                            int64_t groups, int shift, const __m256i* idx, __m256* acc, __m256* cacc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int halves = K / 2 - p * 64 >= 64 ? 2 : 1;
  const int64_t g0 = (4 * p) >> shift;
  const __m256 fz = q4_pairs(szr + 2 * g0, q4_groups_in_block(p, groups, shift));
  for (int h = 0; h < halves; ++h) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p * 64 + h * 32));
    const __m256i lo = _mm256_and_si256(b, low), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    const __m256 sv = _mm256_permutevar8x32_ps(fz, idx[h]);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = xs[t].xq + p * 128 + h * 32;
      const __m256i dp = _mm256_add_epi32(
          dot_u4s8(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
          dot_u4s8(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64))));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_mul_ps(sv, _mm256_loadu_ps(xs[t].dv + p * 16 + h * 8)),
                               acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) cacc[t] = _mm256_fmadd_ps(fz, _mm256_loadu_ps(xs[t].gxv + p * 8), cacc[t]);
}

template <int T>
static void int4_rows_q8(const Q4x* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t groups = K / group, pairs = 2 * groups, blocks = (K + 127) / 128;
  const int shift = log2_exact(group / 32);
  __m256i idx[2];  // lane i of half h reads the scale of chunk (8h + i) / 4's group
  for (int h = 0; h < 2; ++h) {
    alignas(32) int32_t v[8];
    for (int i = 0; i < 8; ++i) v[i] = 2 * (((8 * h + i) / 4) >> shift);
    idx[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  }
  int64_t n = n0;
  if (T == 1) {  // one row of x (decode): four code rows at a time, independent chains, x loads shared
    for (; n + 4 <= n1; n += 4) {
      __m256 acc[4], cacc[4];
      for (int r = 0; r < 4; ++r) acc[r] = cacc[r] = _mm256_setzero_ps();
      for (int64_t p = 0; p < blocks; ++p)
        for (int r = 0; r < 4; ++r) {
          prefetch(codes + (n + r) * (K / 2) + p * 64);
          q4_block<1>(codes + (n + r) * (K / 2), sz + (n + r) * pairs, xs, p, K, groups, shift, idx, acc + r, cacc + r);
        }
      for (int r = 0; r < 4; ++r) y[n + r] = out(s8::hsum(acc[r]) + s8::hsum(cacc[r]), bias, n + r);
    }
  }
  for (; n < n1; ++n) {
    __m256 acc[T], cacc[T];
    for (int t = 0; t < T; ++t) acc[t] = cacc[t] = _mm256_setzero_ps();
    for (int64_t p = 0; p < blocks; ++p) {
      prefetch(codes + n * (K / 2) + p * 64);
      q4_block<T>(codes + n * (K / 2), sz + n * pairs, xs, p, K, groups, shift, idx, acc, cacc);
    }
    for (int t = 0; t < T; ++t) y[t * N + n] = out(s8::hsum(acc[t]) + s8::hsum(cacc[t]), bias, n);
  }
}

// 32 weights of row from column b * 32 (zero-padded past K).
static inline __m256i load_w32(const int8_t* row, int64_t b, int64_t K) {
  if (b * 32 + 32 <= K) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * 32));
  alignas(32) int8_t tmp[32] = {};
  std::memcpy(tmp, row + b * 32, K - b * 32);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}

// The 8-bit body: per 32-column block b, the integer dot product times d_b (dv's 8 lanes of that block).
template <int M>
static void int8_rows_q8(const Q8x* xs, const int8_t* q, const uint16_t* scales, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t nb = (K + 31) / 32;
  int64_t n = n0;
  if (M == 1) {  // one row of x (decode): four weight rows at a time
    for (; n + 4 <= n1; n += 4) {
      __m256 acc[4];
      for (int r = 0; r < 4; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[0].xq + b * 32));
        const __m256 dv = _mm256_loadu_ps(xs[0].dv + (b / 2) * 16 + (b % 2) * 8);
        for (int r = 0; r < 4; ++r) {
          if ((b & 1) == 0) prefetch(q + (n + r) * K + b * 32);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(load_w32(q + (n + r) * K, b, K), xv)), dv, acc[r]);
        }
      }
      for (int r = 0; r < 4; ++r) y[n + r] = out(bf16_to_float(scales[n + r]) * s8::hsum(acc[r]), bias, n + r);
    }
  }
  if (M > 1 && M <= 4) {  // rows of x in company: two weight rows at a time (2M accumulators of 16 registers)
    for (; n + 2 <= n1; n += 2) {
      __m256 acc0[M], acc1[M];
      for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        if ((b & 1) == 0) {
          prefetch(q + n * K + b * 32);
          prefetch(q + (n + 1) * K + b * 32);
        }
        const __m256i w0 = load_w32(q + n * K, b, K), w1 = load_w32(q + (n + 1) * K, b, K);
        for (int m = 0; m < M; ++m) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[m].xq + b * 32));
          const __m256 dv = _mm256_loadu_ps(xs[m].dv + (b / 2) * 16 + (b % 2) * 8);
          acc0[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(w0, xv)), dv, acc0[m]);
          acc1[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(w1, xv)), dv, acc1[m]);
        }
      }
      const float s0 = bf16_to_float(scales[n]), s1 = bf16_to_float(scales[n + 1]);
      for (int m = 0; m < M; ++m) {
        y[m * N + n] = out(s0 * s8::hsum(acc0[m]), bias, n);
        y[m * N + n + 1] = out(s1 * s8::hsum(acc1[m]), bias, n + 1);
      }
    }
  }
  for (; n < n1; ++n) {
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i w = load_w32(q + n * K, b, K);
      for (int m = 0; m < M; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[m].xq + b * 32));
        const __m256 dv = _mm256_loadu_ps(xs[m].dv + (b / 2) * 16 + (b % 2) * 8);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(w, xv)), dv, acc[m]);
      }
    }
    const float s = bf16_to_float(scales[n]);
    for (int m = 0; m < M; ++m) y[m * N + n] = out(s * s8::hsum(acc[m]), bias, n);
  }
}
#endif  // INFERLAB_AVX2

#ifdef INFERLAB_NEON
// Four int32 lanes holding the products of a and b's 16 bytes (signed), added to acc.
static inline int32x4_t dot_s8(int8x16_t a, int8x16_t b, int32x4_t acc) {
#ifdef INFERLAB_NEON_DOT
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
  return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

// One 128-column block of one code row (up to 4 chunks of 16 bytes) against T prepared x rows.
template <int T>
static inline void q4_block(const uint8_t* row, const uint16_t* szr, const Q4x* xs, int64_t p, int64_t K,
                            int64_t groups, int shift, float32x4_t* acc, float* cacc) {
  const int64_t chunks = std::min<int64_t>(4, K / 32 - 4 * p);
  const int64_t g0 = (4 * p) >> shift, ng = q4_groups_in_block(p, groups, shift);
  float fz[8];
  for (int64_t j = 0; j < 2 * ng; ++j) fz[j] = bf16_to_float(szr[2 * g0 + j]);
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8x16_t b = vld1q_u8(row + p * 64 + c * 16);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F)));
    const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
    const float sc = fz[2 * (((4 * p + c) >> shift) - g0)];
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = xs[t].xq + p * 128 + c * 16;
      const int32x4_t d = dot_s8(hi, vld1q_s8(xq + 64), dot_s8(lo, vld1q_s8(xq), vdupq_n_s32(0)));
      acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(d), sc * xs[t].dv[p * 16 + c * 4]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < 2 * ng; ++j) cacc[t] += fz[j] * xs[t].gxv[p * 8 + j];
}

template <int T>
static void int4_rows_q8(const Q4x* xs, const uint8_t* codes, const uint16_t* sz, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t group, int64_t n0, int64_t n1) {
  const int64_t groups = K / group, pairs = 2 * groups, blocks = (K + 127) / 128;
  const int shift = log2_exact(group / 32);
  int64_t n = n0;
  if (T == 1) {  // one row of x (decode): four code rows at a time, independent chains
    for (; n + 4 <= n1; n += 4) {
      float32x4_t acc[4];
      float cacc[4] = {};
      for (int r = 0; r < 4; ++r) acc[r] = vdupq_n_f32(0.f);
      for (int64_t p = 0; p < blocks; ++p)
        for (int r = 0; r < 4; ++r) {
          prefetch(codes + (n + r) * (K / 2) + p * 64);
          q4_block<1>(codes + (n + r) * (K / 2), sz + (n + r) * pairs, xs, p, K, groups, shift, acc + r, cacc + r);
        }
      for (int r = 0; r < 4; ++r) y[n + r] = out(vaddvq_f32(acc[r]) + cacc[r], bias, n + r);
    }
  }
  for (; n < n1; ++n) {
    float32x4_t acc[T];
    float cacc[T] = {};
    for (int t = 0; t < T; ++t) acc[t] = vdupq_n_f32(0.f);
    for (int64_t p = 0; p < blocks; ++p)
      q4_block<T>(codes + n * (K / 2), sz + n * pairs, xs, p, K, groups, shift, acc, cacc);
    for (int t = 0; t < T; ++t) y[t * N + n] = out(vaddvq_f32(acc[t]) + cacc[t], bias, n);
  }
}

// 32 weights of row from column b * 32 as two 16-byte halves (zero-padded past K).
static inline void load_w32(const int8_t* row, int64_t b, int64_t K, int8x16_t& w0, int8x16_t& w1) {
  if (b * 32 + 32 <= K) {
    w0 = vld1q_s8(row + b * 32);
    w1 = vld1q_s8(row + b * 32 + 16);
    return;
  }
  int8_t tmp[32] = {};
  std::memcpy(tmp, row + b * 32, K - b * 32);
  w0 = vld1q_s8(tmp);
  w1 = vld1q_s8(tmp + 16);
}

template <int M>
static void int8_rows_q8(const Q8x* xs, const int8_t* q, const uint16_t* scales, uint16_t* y, const float* bias,
                         int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t nb = (K + 31) / 32;
  // weight rows at a time: one row of x gets four independent chains; 2-4 rows two weight rows (as the x86
  // bodies, where that was 1.3-2x at 2-4 rows of x; here checked for correctness under qemu, not measured)
  constexpr int R = M == 1 ? 4 : M <= 4 ? 2 : 1;
  int64_t n = n0;
  auto rows = [&](int64_t n_first, int rcount) {
    float32x4_t acc[R][M];
    for (int r = 0; r < rcount; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = vdupq_n_f32(0.f);
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < rcount; ++r) {
        int8x16_t w0, w1;
        load_w32(q + (n_first + r) * K, b, K, w0, w1);
        for (int m = 0; m < M; ++m) {
          const int8_t* xq = xs[m].xq + b * 32;
          const int32x4_t d = dot_s8(w1, vld1q_s8(xq + 16), dot_s8(w0, vld1q_s8(xq), vdupq_n_s32(0)));
          acc[r][m] = vfmaq_n_f32(acc[r][m], vcvtq_f32_s32(d), xs[m].dv[(b / 2) * 16 + (b % 2) * 8]);
        }
      }
    for (int r = 0; r < rcount; ++r) {
      const float s = bf16_to_float(scales[n_first + r]);
      for (int m = 0; m < M; ++m) y[m * N + n_first + r] = out(s * vaddvq_f32(acc[r][m]), bias, n_first + r);
    }
  };
  for (; n + R <= n1; n += R) rows(n, R);
  for (; n < n1; ++n) rows(n, 1);
}
#endif  // INFERLAB_NEON
