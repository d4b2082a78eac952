// A row of float32 logits' greedy token in one pass, and whether every logit in it is finite: the sampler's
// greedy rows and its finiteness check (engine/models/layers/sampler.py) where the native module is loaded.
// torch's way was three passes over every row (a chunked max for the argmax, a max and a min for the check)
// and ~10 small ops a step; here each 256-float block is read once: its maximum, and x * 0 summed over the row
// by fused multiply-adds (0 for a finite x, NaN for NaN or +-inf); then the first block holding the row's
// maximum is read again for the first index of it (torch.argmax's tie rule). Four vectors of maxima and four
// of sums run side by side (no one chain of dependent instructions), and the horizontal reduction comes once
// a block: two instructions a vector, so the scan runs at the cache's speed, not the core's.
#pragma once
#include "isa.h"
#include "simd8.h"
#include "attention.h"  // exp512 (the AVX-512 tier)

#include <algorithm>
#include <cmath>
#include <vector>

namespace inferlab {

constexpr int64_t kGreedyBlock = 256;  // floats a block: the first-index search rereads one block

#if defined(INFERLAB_AVX512_BF16)
struct GreedyScan {  // 16 lanes, sixteen vectors a block in four independent chains
  __m512 bad[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  float block_max(const float* p) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 m[4];
    for (int k = 0; k < 4; ++k) {
      const __m512 x = _mm512_loadu_ps(p + 16 * k);
      m[k] = x;
      bad[k] = _mm512_fmadd_ps(x, zero, bad[k]);
    }
    for (int64_t j = 64; j < kGreedyBlock; j += 64)
      for (int k = 0; k < 4; ++k) {
        const __m512 x = _mm512_loadu_ps(p + j + 16 * k);
        m[k] = _mm512_max_ps(m[k], x);
        bad[k] = _mm512_fmadd_ps(x, zero, bad[k]);
      }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
  }
  float total_bad() const {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(bad[0], bad[1]), _mm512_add_ps(bad[2], bad[3])));
  }
};
#elif defined(INFERLAB_SIMD8)
struct GreedyScan {  // 8 lanes (AVX2, NEON), thirty-two vectors a block in four independent chains
  s8::vf bad[4] = {s8::zero(), s8::zero(), s8::zero(), s8::zero()};
  float block_max(const float* p) {
    const s8::vf zero = s8::zero();
    s8::vf m[4];
    for (int k = 0; k < 4; ++k) {
      const s8::vf x = s8::load(p + 8 * k);
      m[k] = x;
      bad[k] = s8::fma(x, zero, bad[k]);
    }
    for (int64_t j = 32; j < kGreedyBlock; j += 32)
      for (int k = 0; k < 4; ++k) {
        const s8::vf x = s8::load(p + j + 8 * k);
        m[k] = s8::max(m[k], x);
        bad[k] = s8::fma(x, zero, bad[k]);
      }
    return s8::hmax(s8::max(s8::max(m[0], m[1]), s8::max(m[2], m[3])));
  }
  float total_bad() const { return s8::hsum(s8::add(s8::add(bad[0], bad[1]), s8::add(bad[2], bad[3]))); }
};
#else
struct GreedyScan {  // portable
  float bad = 0.f;
  float block_max(const float* p) {
    float m = p[0];
    for (int64_t j = 0; j < kGreedyBlock; ++j) m = p[j] > m ? p[j] : m, bad += p[j] * 0.f;
    return m;
  }
  float total_bad() const { return bad; }
};
#endif

// The first index of the largest logit of row[0, n), or -1 when any logit is NaN or infinite (the row
// fails: its request fails alone, as the sampler fails it).
inline int64_t greedy_token(const float* row, int64_t n) {
  GreedyScan scan;
  float best = -INFINITY;
  int64_t best_block = -1;
  const int64_t full = n / kGreedyBlock * kGreedyBlock;
  for (int64_t b = 0; b < full; b += kGreedyBlock) {
    const float m = scan.block_max(row + b);
    if (best_block < 0 || m > best) best = m, best_block = b;  // strict: the first block keeps a tie
  }
  float bad = scan.total_bad();
  int64_t index = -1;
  for (int64_t i = best_block; best_block >= 0 && i < best_block + kGreedyBlock; ++i)
    if (row[i] == best) { index = i; break; }
  for (int64_t i = full; i < n; ++i) {  // the tail, one at a time
    bad += row[i] * 0.f;
    if (index < 0 || row[i] > best) best = row[i], index = i;
  }
  return std::isfinite(bad) ? index : -1;
}

// ---- a sampled row: softmax((x - max) / T) drawn by the inverse of its cumulative distribution ----------
// Pass 1 is greedy_token's (the row's maximum and its check); pass 2 sums e^((x - max) / T) a block of 256
// at a time (vectorised exp, the block sums kept); pass 3 walks the block sums to the block where the
// cumulative mass passes u times the total and recomputes that block's terms, the same way, for the token.
// The torch path (sampler.draw_rows) takes the same first token whose cumulative mass passes u of the total,
// from the same uniform number u: the two agree but for rounding at a boundary. No (vocab)-sized temporary is
// made (torch's path wrote five: the row copy, the shifted and scaled logits, the probabilities, their
// float64 cumulative sum), and a term below e^-87 is zero, so a token of no mass is never drawn.
constexpr float kExpFloor = -87.f;  // below it a term is 0 (exp512 / s8::exp clamp there, not to 0)
constexpr double kSumSlack = 1e-5;  // a block's float sum against its terms summed one by one in double

#if defined(INFERLAB_AVX512_BF16)
// e^((p[j] - mx) * inv) for j < kGreedyBlock into e (when given), their sum returned; a term below
// kExpFloor is 0
inline float exp_block(const float* p, float mx, float inv, float* e) {
  const __m512 m = _mm512_set1_ps(mx), iv = _mm512_set1_ps(inv), floor = _mm512_set1_ps(kExpFloor);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < kGreedyBlock; j += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(p + j), m), iv);
    const __m512 v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, floor, _CMP_GE_OQ), exp512(x));
    if (e != nullptr) _mm512_storeu_ps(e + j, v);
    sum = _mm512_add_ps(sum, v);
  }
  return _mm512_reduce_add_ps(sum);
}
#elif defined(INFERLAB_SIMD8)
inline float exp_block(const float* p, float mx, float inv, float* e) {
  const s8::vf m = s8::set1(mx), iv = s8::set1(inv);
  s8::vf sum = s8::zero();
  alignas(32) float v[8];
  for (int64_t j = 0; j < kGreedyBlock; j += 8) {
    const s8::vf x = s8::mul(s8::sub(s8::load(p + j), m), iv);
    s8::store(v, s8::exp(x));
    float xs[8];
    s8::store(xs, x);
    for (int k = 0; k < 8; ++k) v[k] = xs[k] >= kExpFloor ? v[k] : 0.f;
    if (e != nullptr) std::copy(v, v + 8, e + j);
    sum = s8::add(sum, s8::load(v));
  }
  return s8::hsum(sum);
}
#else
inline float exp_block(const float* p, float mx, float inv, float* e) {
  double sum = 0.0;  // (one running sum of 256 terms: in double, as the vector tiers' lanes are short)
  for (int64_t j = 0; j < kGreedyBlock; ++j) {
    const float x = (p[j] - mx) * inv, v = x >= kExpFloor ? std::exp(x) : 0.f;
    if (e != nullptr) e[j] = v;
    sum += v;
  }
  return static_cast<float>(sum);
}
#endif

inline float exp_term(float x, float mx, float inv) {  // one term of the tail (past the last full block)
  const float y = (x - mx) * inv;
  return y >= kExpFloor ? std::exp(y) : 0.f;
}

// The token drawn from row[0, n) at temperature t > 0 with the uniform number u in [0, 1), or -1 when a logit
// is NaN or infinite (greedy_token's check); `sums`: room for n / kGreedyBlock floats. A temperature so small that 1 / t
// is not finite draws the greedy token (every other term is 0).
inline int64_t sampled_token(const float* row, int64_t n, float t, double u, float* sums) {
  const int64_t greedy = greedy_token(row, n);
  const float inv = 1.f / t;
  if (greedy < 0 || !std::isfinite(inv)) return greedy;
  const float mx = row[greedy];
  const int64_t blocks = n / kGreedyBlock, full = blocks * kGreedyBlock;
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += (sums[b] = exp_block(row + b * kGreedyBlock, mx, inv, nullptr));
  for (int64_t i = full; i < n; ++i) total += exp_term(row[i], mx, inv);
  const double target = u * total;
  double cum = 0.0;
  float e[kGreedyBlock];
  for (int64_t b = 0; b < blocks; ++b) {
    // a block's sum is float lanes' (~1e-6 of it off): one that ends near the target is walked term by term
    if (cum + sums[b] * (1.0 + kSumSlack) <= target) { cum += sums[b]; continue; }
    exp_block(row + b * kGreedyBlock, mx, inv, e);  // the same terms, one by one
    for (int64_t j = 0; j < kGreedyBlock; ++j)
      if (e[j] > 0.f && (cum += e[j]) > target) return b * kGreedyBlock + j;
    // (the terms one by one stayed at the target: the walk goes on)
  }
  for (int64_t i = full; i < n; ++i) {
    const float v = exp_term(row[i], mx, inv);
    if (v > 0.f && (cum += v) > target) return i;
  }
  // rounding left the walk short of a target at the very top of the range: the last token of any mass
  for (int64_t i = n - 1; i >= full; --i)
    if (exp_term(row[i], mx, inv) > 0.f) return i;
  for (int64_t b = blocks - 1; b >= 0; --b) {
    exp_block(row + b * kGreedyBlock, mx, inv, e);
    for (int64_t j = kGreedyBlock - 1; j >= 0; --j)
      if (e[j] > 0.f) return b * kGreedyBlock + j;
  }
  return greedy;  // (not reached: the top token's term is 1)
}

}  // namespace inferlab
