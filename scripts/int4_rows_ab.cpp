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
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include "rows_ab.h"
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
  char* arena = huge_arena(total);
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
  auto sweep = [&](auto fn) {
    return [&, fn](int M) {
      if (std::getenv("HOT")) {  // one gate_up matrix over and over (in L2): the body's compute alone
        for (int i = 0; i < 30; ++i) fn(M, x.data(), mats[2].codes, mats[2].sz, ya.data(), mats[2].K, mats[2].N);
      } else {
        for (auto& m : mats) fn(M, x.data(), m.codes, m.sz, ya.data(), m.K, m.N);
      }
    };
  };
  ab_table(4, sweeps, sweep(rows_a), sweep(rows_b), "%8.3f (%6.3f)");
}
#endif
