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
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
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
  const size_t huge = size_t{2} << 20;
  char* raw = static_cast<char*>(mmap(nullptr, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* arena = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
  madvise(arena, total, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  size_t off = 0;
  for (auto& m : mats) {  // bf16 numbers of magnitude ~0.5-2, either sign
    m.w = reinterpret_cast<uint16_t*>(arena + off);
    off += m.N * m.K * 2;
    for (int64_t i = 0; i < m.N * m.K; ++i) m.w[i] = static_cast<uint16_t>(0x3e00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  }
  std::vector<uint16_t> x(8 * 1536), y(8 * 49152);
  for (auto& v : x) v = static_cast<uint16_t>(0x3e00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  auto run = [&](auto fn, int M) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& m : mats) fn(M, x.data(), m.w, y.data(), m.K, m.N);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<std::vector<double>> ta(9), tb(9);
  for (int s = 0; s < sweeps; ++s)
    for (int M = 1; M <= 8; ++M) {
      if (s % 2) {
        tb[M].push_back(run(rows_b, M));
        ta[M].push_back(run(rows_a, M));
      } else {
        ta[M].push_back(run(rows_a, M));
        tb[M].push_back(run(rows_b, M));
      }
    }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  auto low = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf("rows  A median (min) ms  x A's 1 row | B median (min) ms  x B's 1 row | B / A\n");
  for (int M = 1; M <= 8; ++M)
    std::printf("%4d  %8.2f (%6.2f)  %5.2fx      | %8.2f (%6.2f)  %5.2fx      | %.2f\n", M, med(ta[M]), low(ta[M]),
                med(ta[M]) / med(ta[1]), med(tb[M]), low(tb[M]), med(tb[M]) / med(tb[1]), med(tb[M]) / med(ta[M]));
}
#endif
