// Two builds of the int4 x int8-activation body (engine/kernels/core/linear.h: int4_q8_prepare, int4_q8_range)
// side by side, torch-free: SmolLM2-135M's int4 matrices (30 layers of qkv 960 x 576, o_proj 576 x 576,
// gate_up 3072 x 576, down_proj 576 x 1536; group 32) in one huge-page arena in step order, 1-4 rows of x, the
// two builds alternating sweep by sweep. Built and run by scripts/bf16_rows_ab.sh with AB_SRC=int4_rows_ab.cpp.
#include <cstdint>
#ifdef FN
#include "core/linear.h"
extern "C" void FN(int M, const uint16_t* x, const uint8_t* codes, const uint16_t* sz, uint16_t* y, int64_t K,
                   int64_t N) {
  thread_local std::vector<float> scratch;
  scratch.resize(inferlab::q4_scratch_floats(M, K));
  inferlab::Q4x xs[8];
  inferlab::int4_q8_prepare(x, M, K, 32, scratch.data(), xs);
  inferlab::int4_q8_range(xs, M, codes, sz, 32, nullptr, K, N, y, 0, N);
}
#endif
#ifdef MAIN
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
extern "C" void rows_a(int, const uint16_t*, const uint8_t*, const uint16_t*, uint16_t*, int64_t, int64_t);
extern "C" void rows_b(int, const uint16_t*, const uint8_t*, const uint16_t*, uint16_t*, int64_t, int64_t);
struct Mat {
  int64_t N, K;
  uint8_t* codes;
  uint16_t* sz;
};
int main(int argc, char** argv) {
  const int sweeps = argc > 1 ? std::atoi(argv[1]) : 15;
  std::vector<Mat> mats;
  for (int l = 0; l < 30; ++l)
    for (auto nk : {std::pair<int64_t, int64_t>{960, 576}, {576, 576}, {3072, 576}, {576, 1536}})
      mats.push_back({nk.first, nk.second, nullptr, nullptr});
  size_t total = 0;
  for (auto& m : mats) total += m.N * m.K / 2 + m.N * (m.K / 32) * 4 + 64;
  const size_t huge = size_t{2} << 20;
  char* raw = static_cast<char*>(mmap(nullptr, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* arena = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
  madvise(arena, total, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  size_t off = 0;
  for (auto& m : mats) {
    m.codes = reinterpret_cast<uint8_t*>(arena + off);
    off += m.N * m.K / 2;
    for (int64_t i = 0; i < m.N * m.K / 2; ++i) m.codes[i] = static_cast<uint8_t>(rng());
    m.sz = reinterpret_cast<uint16_t*>(arena + off);
    off += m.N * (m.K / 32) * 4 + 64;
    for (int64_t i = 0; i < m.N * (m.K / 32) * 2; ++i) m.sz[i] = static_cast<uint16_t>(0x3c00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  }
  std::vector<uint16_t> x(8 * 1536), ya(8 * 3072), yb(8 * 3072);
  for (auto& v : x) v = static_cast<uint16_t>(0x3e00 + (rng() & 0x1ff) + ((rng() & 1) << 15));
  // the two bodies must agree (they compute the same sums; a changed order may differ in the last bits)
  double worst = 0;
  for (int M = 1; M <= 4; ++M)
    for (auto& m : mats) {
      rows_a(M, x.data(), m.codes, m.sz, ya.data(), m.K, m.N);
      rows_b(M, x.data(), m.codes, m.sz, yb.data(), m.K, m.N);
      for (int64_t i = 0; i < M * m.N; ++i) {
        auto f = [](uint16_t h) { uint32_t b = uint32_t{h} << 16; float v; std::memcpy(&v, &b, 4); return v; };
        worst = std::max(worst, std::fabs(double(f(ya[i])) - f(yb[i])) / (std::fabs(double(f(ya[i]))) + 1.0));
      }
    }
  std::printf("largest relative difference A vs B: %.3g\n", worst);
  auto run = [&](auto fn, int M) {
    const auto t0 = std::chrono::steady_clock::now();
    if (std::getenv("HOT")) {  // one gate_up matrix over and over (in L2): the body's compute alone
      for (int i = 0; i < 30; ++i) fn(M, x.data(), mats[2].codes, mats[2].sz, ya.data(), mats[2].K, mats[2].N);
    } else {
      for (auto& m : mats) fn(M, x.data(), m.codes, m.sz, ya.data(), m.K, m.N);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<std::vector<double>> ta(5), tb(5);
  for (int s = 0; s < sweeps; ++s)
    for (int M = 1; M <= 4; ++M) {
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
  for (int M = 1; M <= 4; ++M)
    std::printf("%4d  %8.3f (%6.3f)  %5.2fx      | %8.3f (%6.3f)  %5.2fx      | %.2f\n", M, med(ta[M]), low(ta[M]),
                med(ta[M]) / med(ta[1]), med(tb[M]), low(tb[M]), med(tb[M]) / med(tb[1]), med(tb[M]) / med(ta[M]));
}
#endif
