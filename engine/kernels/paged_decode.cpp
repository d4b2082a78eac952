// Decode attention straight from the paged KV cache: one query token per sequence, the GQA group of
// query heads sharing each KV head together, K and V read once where they lie (no gathered copy).
// Memory-bound by design: every context token's K and V row is streamed once per step.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <vector>

static inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

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
  const uint16_t* q = reinterpret_cast<const uint16_t*>(qd.data_ptr());
  const uint16_t* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  const uint16_t* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  const int64_t* bt = blocks_c.data_ptr<int64_t>();
  const int64_t* lens = lens_c.data_ptr<int64_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * d);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t s = job / kv_heads, h = job % kv_heads;
      const uint16_t* qs = q + job * group * d;
      const uint16_t* kh = kc + h * slots * d;
      const uint16_t* vh = vc + h * slots * d;
      uint16_t* os = o + job * group * d;
      if (d == 64)
        attend_one<64>(qs, kh, vh, bt + s * max_blocks, lens[s], block_size, group, scores, acc.data(), os);
      else
        attend_one<128>(qs, kh, vh, bt + s * max_blocks, lens[s], block_size, group, scores, acc.data(), os);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention over the paged KV cache (bf16)");
}
