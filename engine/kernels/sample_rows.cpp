// Each row's greedy token as a torch op (the sampler's greedy rows and finiteness check on the CPU, where
// the native module is loaded): core/rows.h's one pass a row, rows split between torch's threads.
// Included by module.cpp.
#pragma once
#include "torch_common.h"
#include "core/rows.h"

// logits (n, vocab) float32, rows contiguous -> (n,) int64: each row's first largest logit, -1 where a
// logit of that row is NaN or infinite.
torch::Tensor greedy_rows(torch::Tensor logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "greedy_rows: (rows, vocab) float32 logits");
  TORCH_CHECK(logits.device().is_cpu(), "greedy_rows: CPU tensors");
  TORCH_CHECK(logits.stride(1) == 1, "greedy_rows: each row's logits contiguous");
  const int64_t n = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  auto out = torch::empty({n}, torch::dtype(torch::kInt64));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  inferlab::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) o[r] = inferlab::greedy_token(x + r * stride, vocab);
  });
  return out;
}
