// Decode attention straight from the paged KV cache: one query token per sequence, the GQA group of
// query heads sharing each KV head together, K and V read once where they lie (no gathered copy).
// Memory-bound by design: every context token's K and V row is streamed once per step.
//
// Two bodies compute the same thing: a portable one (attend_one) and, where the compiler targets
// AVX-512 with bf16 dot products, one written with intrinsics (attend_one_avx512: K rows multiplied
// as bf16 pairs with float32 sums, a vectorised exp, V accumulated in float32 registers). Work is
// split between threads by context length, not by count, so a few long documents in a batch of
// short chats do not all land on one thread.
#include "common.h"

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
#endif

// One (sequence, KV head) job, by head_dim and by the best body this build has.
static inline void attend(const uint16_t* qs, const uint16_t* kh, const uint16_t* vh, const int64_t* bt,
                          int64_t len, int64_t block_size, int64_t group, int64_t d, std::vector<float>& scores,
                          std::vector<float>& acc, uint16_t* os) {
#ifdef INFERLAB_AVX512_BF16
  if (d == 64) return attend_one_avx512<64>(qs, kh, vh, bt, len, block_size, group, scores, os);
  return attend_one_avx512<128>(qs, kh, vh, bt, len, block_size, group, scores, os);
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

// Raw entry: q (n, kv_heads, group, d) scaled, caches (kv_heads, slots, d),
// bt (n, max_blocks), lens (n,) -> o (n, kv_heads, group, d).
static void paged_decode_raw(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const int64_t* bt,
                             const int64_t* lens, int64_t n, int64_t kv_heads, int64_t group, int64_t d,
                             int64_t slots, int64_t max_blocks, int64_t block_size, uint16_t* o) {
  const int64_t jobs = n * kv_heads;
  const std::vector<int64_t> cost = job_costs(lens, n, kv_heads);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(jobs, at::get_num_threads()));
  at::parallel_for(0, parts, 1, [&](int64_t p_begin, int64_t p_end) {
    std::vector<float> scores, acc(group * d);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const auto [first, last] = job_share(cost, p, parts);
      for (int64_t job = first; job < last; ++job) {
        const int64_t s = job / kv_heads, h = job % kv_heads;
        attend(q + job * group * d, kc + h * slots * d, vc + h * slots * d, bt + s * max_blocks, lens[s],
               block_size, group, d, scores, acc, o + job * group * d);
      }
    }
  });
}

// qd: (n, kv_heads, group, head_dim) bf16, already scaled; k_cache, v_cache: (kv_heads, slots, head_dim)
// bf16; blocks: (n, max_blocks) int64; ctx_lens: (n,) int64. Returns (n, kv_heads, group, head_dim) bf16.
torch::Tensor paged_decode(torch::Tensor qd, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor blocks, torch::Tensor ctx_lens, int64_t block_size) {
  TORCH_CHECK(qd.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
              v_cache.scalar_type() == at::kBFloat16, "paged_decode: bf16 tensors only");
  TORCH_CHECK(qd.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t n = qd.size(0), kv_heads = qd.size(1), group = qd.size(2), d = qd.size(3);
  TORCH_CHECK(group <= 8, "paged_decode: at most 8 query heads per KV head");
  TORCH_CHECK(d == 64 || d == 128, "paged_decode: head_dim 64 or 128");
  const int64_t slots = k_cache.size(1), max_blocks = blocks.size(1);
  auto out = torch::empty_like(qd);
  auto blocks_c = blocks.contiguous();
  auto lens_c = ctx_lens.contiguous();
  paged_decode_raw(reinterpret_cast<const uint16_t*>(qd.data_ptr()), reinterpret_cast<const uint16_t*>(k_cache.data_ptr()),
                   reinterpret_cast<const uint16_t*>(v_cache.data_ptr()), blocks_c.data_ptr<int64_t>(),
                   lens_c.data_ptr<int64_t>(), n, kv_heads, group, d, slots, max_blocks, block_size,
                   reinterpret_cast<uint16_t*>(out.data_ptr()));
  return out;
}

#ifndef INFERLAB_NO_MODULE  // fused_decode.cpp includes this file as its own body
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL while it runs (as torch's own ops): the app's GUI thread keeps running meanwhile.
  m.def("paged_decode", &paged_decode, "decode attention over the paged KV cache (bf16)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
#endif
