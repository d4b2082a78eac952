// Each row's token as a torch op (the sampler's rows and finiteness check on the CPU, where the native module
// is loaded): core/rows.h's one pass a greedy row (greedy_rows), three a sampled one (sample_rows), rows split
// between torch's threads.
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

// logits (n, vocab) float32, rows contiguous; temperature (n,) float32 (0: greedy); u (n,) float64 uniform numbers
// in [0, 1) -> (n,) int64: each row's greedy token (temperature 0) or the token drawn at its temperature with its
// u (core/rows.h sampled_token), -1 where a logit of that row is NaN or infinite.
torch::Tensor sample_rows(torch::Tensor logits, torch::Tensor temperature, torch::Tensor u) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "sample_rows: (rows, vocab) float32 logits");
  TORCH_CHECK(logits.device().is_cpu() && temperature.device().is_cpu() && u.device().is_cpu(),
              "sample_rows: CPU tensors");
  TORCH_CHECK(logits.stride(1) == 1, "sample_rows: each row's logits contiguous");
  const int64_t n = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  TORCH_CHECK(temperature.dim() == 1 && temperature.size(0) == n && temperature.scalar_type() == at::kFloat
                  && temperature.is_contiguous(), "sample_rows: (rows,) float32 temperatures");
  TORCH_CHECK(u.dim() == 1 && u.size(0) == n && u.scalar_type() == at::kDouble && u.is_contiguous(),
              "sample_rows: (rows,) float64 uniform numbers");
  auto out = torch::empty({n}, torch::dtype(torch::kInt64));
  const float* x = logits.data_ptr<float>();
  const float* t = temperature.data_ptr<float>();
  const double* uu = u.data_ptr<double>();
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r)  // (checked before the threads: an exception cannot leave one)
    TORCH_CHECK(t[r] >= 0.f && uu[r] >= 0.0 && uu[r] < 1.0, "sample_rows: row ", r,
                ": temperature >= 0 and u in [0, 1) (", t[r], ", ", uu[r], ")");
  inferlab::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> sums(vocab / inferlab::kGreedyBlock + 1);
    for (int64_t r = r0; r < r1; ++r) {
      o[r] = t[r] > 0.f ? inferlab::sampled_token(x + r * stride, vocab, t[r], uu[r], sums.data())
                        : inferlab::greedy_token(x + r * stride, vocab);
    }
  });
  return out;
}
