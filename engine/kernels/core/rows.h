// A row of float32 logits' greedy token in one pass, and whether every logit in it is finite: the sampler's
// greedy rows and its finiteness check (engine/models/layers/sampler.py) where the native module is loaded.
// torch's way was three passes over every row (a chunked max for the argmax, a max and a min for the check)
// and ~10 small ops a step; here each 64-float block is read once: its maximum, and x - x summed over the
// row (0 for a finite x, NaN for NaN or +-inf); then the first block holding the row's maximum is read
// again for the first index of it (torch.argmax's tie rule).
#pragma once
#include "isa.h"
#include "simd8.h"

namespace inferlab {

constexpr int64_t kGreedyBlock = 64;  // floats a block: the first-index search rereads one block

#if defined(INFERLAB_AVX512_BF16)
struct GreedyScan {  // 16 lanes, four vectors a block
  __m512 bad = _mm512_setzero_ps();
  float block_max(const float* p) {
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16), c = _mm512_loadu_ps(p + 32),
                 d = _mm512_loadu_ps(p + 48);
    const __m512 ab = _mm512_add_ps(_mm512_sub_ps(a, a), _mm512_sub_ps(b, b));
    const __m512 cd = _mm512_add_ps(_mm512_sub_ps(c, c), _mm512_sub_ps(d, d));
    bad = _mm512_add_ps(bad, _mm512_add_ps(ab, cd));
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a, b), _mm512_max_ps(c, d)));
  }
  float total_bad() const { return _mm512_reduce_add_ps(bad); }
};
#elif defined(INFERLAB_SIMD8)
struct GreedyScan {  // 8 lanes (AVX2, NEON), eight vectors a block
  s8::vf bad = s8::zero();
  float block_max(const float* p) {
    s8::vf m = s8::load(p), sum = s8::sub(m, m);
    for (int64_t j = 8; j < kGreedyBlock; j += 8) {
      const s8::vf x = s8::load(p + j);
      m = s8::max(m, x);
      sum = s8::add(sum, s8::sub(x, x));
    }
    bad = s8::add(bad, sum);
    return s8::hmax(m);
  }
  float total_bad() const { return s8::hsum(bad); }
};
#else
struct GreedyScan {  // portable
  float bad = 0.f;
  float block_max(const float* p) {
    float m = p[0];
    for (int64_t j = 0; j < kGreedyBlock; ++j) m = p[j] > m ? p[j] : m, bad += p[j] - p[j];
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
    bad += row[i] - row[i];
    if (index < 0 || row[i] > best) best = row[i], index = i;
  }
  return std::isfinite(bad) ? index : -1;
}

}  // namespace inferlab
