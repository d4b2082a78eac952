// Decode attention straight from the paged KV cache: one query token per sequence, the GQA group of
// query heads sharing each KV head together, K and V read once where they lie (no gathered copy).
// Memory-bound by design: every context token's K and V row is streamed once per step. No torch here
// (paged_decode.cpp and fused_decode.cpp split the jobs between threads).
//
// One body per ISA tier computes the same thing: a portable one (attend_one); AVX-512 with bf16 dot
// products (attend_one_avx512: K rows multiplied as bf16 pairs with float32 sums, a vectorised exp, V
// accumulated in float32 registers); AVX2 and NEON (attend_one_simd8, eight float32 lanes). Work is
// split between threads by context length, not by count, so a few long documents in a batch of short
// chats do not all land on one thread (job_costs, job_share).
#pragma once
#include "isa.h"
#include "simd8.h"

namespace inferlab {

// Calls row(t, x) for every context token t in order, x its D values widened to float32, walking the
// sequence's blocks (one block: block_size rows of D in one KV head's slots).
template <int D, typename Row>
static inline void for_each_row(const uint16_t* head, const int64_t* bt, int64_t len, int64_t block_size,
                                Row row) {
  alignas(64) float x[D];
  for (int64_t t0 = 0; t0 < len; t0 += block_size) {
    const uint16_t* block = head + bt[t0 / block_size] * block_size * D;
    const int64_t rows = std::min(block_size, len - t0);
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (int j = 0; j < D; ++j) x[j] = bf16_to_float(block[r * D + j]);
      row(t0 + r, x);
    }
  }
}

// One (sequence, KV head): scores over the context, softmax, weighted sum of V.
// D is a compile-time constant so the inner loops vectorise.
template <int D>
static void attend_one(const uint16_t* qs, const uint16_t* kh, const uint16_t* vh, const int64_t* bt,
                       int64_t len, int64_t block_size, int64_t group, std::vector<float>& scores,
                       float* acc, uint16_t* os) {
  alignas(64) float qf[8][D];
  for (int64_t g = 0; g < group; ++g)
    for (int j = 0; j < D; ++j) qf[g][j] = bf16_to_float(qs[g * D + j]);
  scores.resize(group * len);
  for_each_row<D>(kh, bt, len, block_size, [&](int64_t t, const float* k) {
    for (int64_t g = 0; g < group; ++g) {
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j < D; ++j) dot += qf[g][j] * k[j];
      scores[g * len + t] = dot;
    }
  });
  for (int64_t g = 0; g < group; ++g) {  // softmax in float32
    float* sg = scores.data() + g * len;
    float mx = -INFINITY;
    for (int64_t t = 0; t < len; ++t) mx = std::max(mx, sg[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) { sg[t] = std::exp(sg[t] - mx); sum += sg[t]; }
    const float inv = 1.f / sum;
    for (int64_t t = 0; t < len; ++t) sg[t] *= inv;
  }
  for (int64_t i = 0; i < group * D; ++i) acc[i] = 0.f;
  for_each_row<D>(vh, bt, len, block_size, [&](int64_t t, const float* v) {
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * len + t];
      float* ag = acc + g * D;
#pragma omp simd
      for (int j = 0; j < D; ++j) ag[j] += p * v[j];
    }
  });
  for (int64_t i = 0; i < group * D; ++i) os[i] = float_to_bf16(acc[i]);
}


#ifdef INFERLAB_AVX512_BF16
// e^x for x <= 0 (scores minus their maximum): 2^n * e^r with r in [-ln2/2, ln2/2], Cephes' polynomial.
static inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

static inline __m512 bf16x16_to_float(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The same as attend_one, with intrinsics. Scores: each K row times each query head as 32 bf16 pairs
// per instruction (exact products, float32 sums). V: rows widened to float32, 16 lanes at a time.
template <int D>
static void attend_one_avx512(const uint16_t* qs, const uint16_t* kh, const uint16_t* vh, const int64_t* bt,
                              int64_t len, int64_t block_size, int64_t group, std::vector<float>& scores,
                              uint16_t* os) {
  constexpr int NK = D / 32, NV = D / 16;
  __m512bh qv[8][NK];
  for (int64_t g = 0; g < group; ++g)
    for (int i = 0; i < NK; ++i) qv[g][i] = (__m512bh)_mm512_loadu_si512(qs + g * D + i * 32);
  const int64_t stride = (len + 15) & ~int64_t(15);
  scores.resize(group * stride);
  float* sc = scores.data();
  for (int64_t t0 = 0; t0 < len; t0 += block_size) {
    const uint16_t* block = kh + bt[t0 / block_size] * block_size * D;
    const int64_t rows = std::min(block_size, len - t0);
    for (int64_t r = 0; r < rows; ++r) {
      __m512bh kv[NK];
      for (int i = 0; i < NK; ++i) kv[i] = (__m512bh)_mm512_loadu_si512(block + r * D + i * 32);
      for (int64_t g = 0; g < group; ++g) {
        __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), kv[0], qv[g][0]);
        for (int i = 1; i < NK; ++i) a = _mm512_dpbf16_ps(a, kv[i], qv[g][i]);
        sc[g * stride + t0 + r] = _mm512_reduce_add_ps(a);
      }
    }
  }
  float inv[8];
  const __mmask16 tail = static_cast<__mmask16>((1u << (len & 15)) - 1);
  for (int64_t g = 0; g < group; ++g) {  // softmax numerators in place; 1 / sum kept for the end
    float* sg = sc + g * stride;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= len; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sg + t));
    if (t < len) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, sg + t));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= len; t += 16) {
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sg + t), m));
      _mm512_storeu_ps(sg + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (t < len) {
      const __m512 e = _mm512_maskz_mov_ps(tail, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sg + t), m)));
      _mm512_mask_storeu_ps(sg + t, tail, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
  __m512 acc[8][NV];
  for (int64_t g = 0; g < group; ++g)
    for (int i = 0; i < NV; ++i) acc[g][i] = _mm512_setzero_ps();
  for (int64_t t0 = 0; t0 < len; t0 += block_size) {
    const uint16_t* block = vh + bt[t0 / block_size] * block_size * D;
    const int64_t rows = std::min(block_size, len - t0);
    for (int64_t r = 0; r < rows; ++r) {
      __m512 v[NV];
      for (int i = 0; i < NV; ++i) v[i] = bf16x16_to_float(block + r * D + i * 16);
      for (int64_t g = 0; g < group; ++g) {
        const __m512 p = _mm512_set1_ps(sc[g * stride + t0 + r]);
        for (int i = 0; i < NV; ++i) acc[g][i] = _mm512_fmadd_ps(p, v[i], acc[g][i]);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int i = 0; i < NV; ++i) {
      const __m512 o = _mm512_mul_ps(acc[g][i], _mm512_set1_ps(inv[g]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(os + g * D + i * 16), (__m256i)_mm512_cvtneps_pbh(o));
    }
}
#elif defined(INFERLAB_SIMD8)
// The same as attend_one, eight lanes at a time (core/simd8.h): each K row widened once into kf and
// multiplied with every query head of the group; a vectorised exp; V rows widened and accumulated in
// float32, per head.
template <int D>
static void attend_one_simd8(const uint16_t* qs, const uint16_t* kh, const uint16_t* vh, const int64_t* bt,
                             int64_t len, int64_t block_size, int64_t group, std::vector<float>& scores,
                             float* acc, uint16_t* os) {
  using namespace s8;
  constexpr int NV = D / 8;
  alignas(64) float qf[8][D];
  alignas(64) float kf[D];
  for (int64_t g = 0; g < group; ++g)
    for (int i = 0; i < NV; ++i) store(qf[g] + i * 8, load_bf16(qs + g * D + i * 8));
  const int64_t stride = (len + 7) & ~int64_t(7);
  scores.resize(group * stride);
  float* sc = scores.data();
  for (int64_t t0 = 0; t0 < len; t0 += block_size) {
    const uint16_t* block = kh + bt[t0 / block_size] * block_size * D;
    const int64_t rows = std::min(block_size, len - t0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int i = 0; i < NV; ++i) store(kf + i * 8, load_bf16(block + r * D + i * 8));
      for (int64_t g = 0; g < group; ++g) {
        vf a0 = zero(), a1 = zero();  // two chains
        for (int i = 0; i < NV; i += 2) {
          a0 = fma(load(kf + i * 8), load(qf[g] + i * 8), a0);
          a1 = fma(load(kf + i * 8 + 8), load(qf[g] + i * 8 + 8), a1);
        }
        sc[g * stride + t0 + r] = hsum(add(a0, a1));
      }
    }
  }
  float inv[8];
  for (int64_t g = 0; g < group; ++g) {  // softmax numerators in place; 1 / sum kept for the end
    float* sg = sc + g * stride;
    for (int64_t t = len; t < stride; ++t) sg[t] = -INFINITY;  // the padding adds e^-inf = 0
    vf mx = set1(-INFINITY);
    for (int64_t t = 0; t < stride; t += 8) mx = max(mx, load(sg + t));
    const vf m = set1(hmax(mx));
    vf sum = zero();
    for (int64_t t = 0; t < stride; t += 8) {
      const vf e = exp(sub(load(sg + t), m));
      store(sg + t, e);
      sum = add(sum, e);
    }
    float total = hsum(sum);
    for (int64_t t = len; t < stride; ++t) total -= sg[t];  // e^(-87) of the clamped padding, if any
    inv[g] = 1.f / total;
  }
  for (int64_t i = 0; i < group * D; ++i) acc[i] = 0.f;
  for (int64_t t0 = 0; t0 < len; t0 += block_size) {
    const uint16_t* block = vh + bt[t0 / block_size] * block_size * D;
    const int64_t rows = std::min(block_size, len - t0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int i = 0; i < NV; ++i) store(kf + i * 8, load_bf16(block + r * D + i * 8));
      for (int64_t g = 0; g < group; ++g) {
        const vf p = set1(sc[g * stride + t0 + r]);
        float* ag = acc + g * D;
        for (int i = 0; i < NV; ++i) store(ag + i * 8, fma(p, load(kf + i * 8), load(ag + i * 8)));
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const vf s = set1(inv[g]);
    for (int i = 0; i < NV; ++i) store_bf16(os + g * D + i * 8, mul(load(acc + g * D + i * 8), s));
  }
}
#endif

// One (sequence, KV head) job, by head_dim and by the best body this build has.
static inline void attend(const uint16_t* qs, const uint16_t* kh, const uint16_t* vh, const int64_t* bt,
                          int64_t len, int64_t block_size, int64_t group, int64_t d, std::vector<float>& scores,
                          std::vector<float>& acc, uint16_t* os) {
#ifdef INFERLAB_AVX512_BF16
  (void)acc;
  if (d == 64) return attend_one_avx512<64>(qs, kh, vh, bt, len, block_size, group, scores, os);
  return attend_one_avx512<128>(qs, kh, vh, bt, len, block_size, group, scores, os);
#elif defined(INFERLAB_SIMD8)
  if (d == 64) return attend_one_simd8<64>(qs, kh, vh, bt, len, block_size, group, scores, acc.data(), os);
  return attend_one_simd8<128>(qs, kh, vh, bt, len, block_size, group, scores, acc.data(), os);
#else
  if (d == 64) return attend_one<64>(qs, kh, vh, bt, len, block_size, group, scores, acc.data(), os);
  attend_one<128>(qs, kh, vh, bt, len, block_size, group, scores, acc.data(), os);
#endif
}

// Jobs are (sequence, KV head) pairs, job = sequence * kv_heads + head; each thread gets a run of them
// with about the same total context (a fixed cost per job counts too), so the few long documents of a
// batch spread out. job_costs: the running sum of the jobs' costs (jobs + 1 entries); job_share: the
// jobs [first, last) of part p of parts.
static std::vector<int64_t> job_costs(const int64_t* lens, int64_t n, int64_t kv_heads) {
  std::vector<int64_t> cost(n * kv_heads + 1, 0);
  for (int64_t j = 0; j < n * kv_heads; ++j) cost[j + 1] = cost[j] + lens[j / kv_heads] + 16;
  return cost;
}

static std::pair<int64_t, int64_t> job_share(const std::vector<int64_t>& cost, int64_t p, int64_t parts) {
  const int64_t jobs = static_cast<int64_t>(cost.size()) - 1;
  const int64_t first = std::lower_bound(cost.begin(), cost.end(), cost[jobs] * p / parts) - cost.begin();
  const int64_t last = std::lower_bound(cost.begin(), cost.end(), cost[jobs] * (p + 1) / parts) - cost.begin();
  return {std::min(first, jobs), std::min(last, jobs)};
}


}  // namespace inferlab
