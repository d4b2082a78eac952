// Decode attention over the paged KV cache as a torch op (the "native" attention backend of the layer
// path): the body is core/attention.h's; here the inputs are checked and the (sequence, KV head) jobs
// split between torch's threads by context length. Included by module.cpp.
#pragma once
#include "torch_common.h"
#include "core/attention.h"

using namespace inferlab;

// Raw entry: q (n, kv_heads, group, d) scaled, caches (kv_heads, slots, d),
// bt (n, max_blocks), lens (n,) -> o (n, kv_heads, group, d).
static void paged_decode_raw(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const int64_t* bt,
                             const int64_t* lens, int64_t n, int64_t kv_heads, int64_t group, int64_t d,
                             int64_t slots, int64_t max_blocks, int64_t block_size, uint16_t* o) {
  const int64_t jobs = n * kv_heads;
  const std::vector<int64_t> cost = job_costs(lens, n, kv_heads);
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(jobs, at::get_num_threads()));
  inferlab::parallel_for(0, parts, 1, [&](int64_t p_begin, int64_t p_end) {
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
