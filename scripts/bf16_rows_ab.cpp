// Two builds of the bf16 weight-streaming body (engine/kernels/core/linear.h) side by side, torch-free: all of
// SmolLM2-135M's bf16 matrices (30 layers of qkv 960 x 576, o_proj 576 x 576, gate_up 3072 x 576, down_proj
// 576 x 1536, then the lm_head 49152 x 576) in one huge-page arena in the order a decode step reads them (as
// the engine keeps them: engine/runner/huge_pages.py), 1-8 rows of x, the two builds alternating sweep by
// sweep, the median and minimum of each. Built and run by scripts/bf16_rows_ab.sh (the body at a git revision
// against the working tree's). Compiled twice with -DFN=rows_a / -DFN=rows_b for the bodies, once with
// -DMAIN for the driver.
#include <cstdint>
#ifdef FN
#include "core/linear.h"
extern "C" void FN(int M, const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t K, int64_t N) {
  inferlab::bf16_rows_for(M)(x, w, y, nullptr, K, N, 0, N);
}
#endif
#ifdef MAIN
#include <cstdlib>
#include <random>
#include "rows_ab.h"
extern "C" void rows_a(int, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t);
extern "C" void rows_b(int, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t);
struct Mat {
  int64_t N, K;
  uint16_t* w;
};
int main(int argc, char** argv) {
  const int sweeps = argc > 1 ? std::atoi(argv[1]) : 15;
  std::vector<Mat> mats;
  for (int l = 0; l < 30; ++l)
    for (auto nk : {std::pair<int64_t, int64_t>{960, 576}, {576, 576}, {3072, 576}, {576, 1536}})
      mats.push_back({nk.first, nk.second, nullptr});
  mats.push_back({49152, 576, nullptr});
  size_t total = 0;
  for (auto& m : mats) total += m.N * m.K * 2;
  char* arena = huge_arena(total);
  std::mt19937 rng(1);
  size_t off = 0;
  for (auto& m : mats) {  // bf16 numbers of magnitude ~0.5-2, either sign
    m.w = reinterpret_cast<uint16_t*>(arena + off);
    off += m.N * m.K * 2;
    for (int64_t i = 0; i < m.N * m.K; ++i) m.w[i] = static_cast<uint16_t>(0x3e00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  }
  std::vector<uint16_t> x(8 * 1536), y(8 * 49152);
  for (auto& v : x) v = static_cast<uint16_t>(0x3e00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  auto sweep = [&](auto fn) {
    return [&, fn](int M) {
      for (auto& m : mats) fn(M, x.data(), m.w, y.data(), m.K, m.N);
    };
  };
  ab_table(8, sweeps, sweep(rows_a), sweep(rows_b));
}
#endif
