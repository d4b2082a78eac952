// The bf16 weight-streaming body of one ISA tier (engine/kernels/core/linear.h), torch-free and alone on
// the machine: 1-8 rows of x against `copies` matrices N x K (from memory), the minimum of 9 sweeps, and a
// check that every row of a 2- to 8-row call is bit for bit the row alone. Quieter than
// scripts/kernel_ab.py (no torch, no extension call), for one shape at a time, e.g. SmolLM2-135M's down_proj
// (30 x 576 x 1536) and gate_up (30 x 3072 x 576) on the AVX2 body:
//
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c -I engine/kernels scripts/bf16_rows_bench.cpp -o /tmp/b
//   /tmp/b 1536 576 30; /tmp/b 576 3072 30
//
// (-march=native for this CPU's own tier.) Ratios from one run only: the machine's speed drifts. Against
// another revision of the body, on all of the model's matrices: scripts/bf16_rows_ab.sh.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include "core/linear.h"
using namespace inferlab;
int main(int argc, char** argv) {
  const int64_t K = std::stoi(argv[1]), N = std::stoi(argv[2]), copies = std::stoi(argv[3]);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::vector<uint16_t>> ws(copies, std::vector<uint16_t>(N * K));
  for (auto& w : ws) for (auto& v : w) v = float_to_bf16(u(rng));
  std::vector<uint16_t> x(8 * K), y(8 * N), y1(N);
  for (auto& v : x) v = float_to_bf16(u(rng));
  // exact: every row of a 2- to 8-row call equals the row alone
  for (int M = 2; M <= 8; ++M) {
    bf16_rows_for(M)(x.data(), ws[0].data(), y.data(), nullptr, K, N, 0, N);
    bool same = true;
    for (int m = 0; m < M; ++m) {
      bf16_rows_for(1)(x.data() + m * K, ws[0].data(), y1.data(), nullptr, K, N, 0, N);
      for (int64_t n = 0; n < N; ++n) same &= y1[n] == y[m * N + n];
    }
    std::printf("K=%ld M=%d rows bit for bit alone: %s\n", (long)K, M, same ? "yes" : "NO");
  }
  double best[9];
  for (auto& b : best) b = 1e9;
  for (int it = 0; it < 9; ++it)
    for (int m = 1; m <= 8; ++m) {
      auto t0 = std::chrono::steady_clock::now();
      for (auto& w : ws) bf16_rows_for(m)(x.data(), w.data(), y.data(), nullptr, K, N, 0, N);
      best[m] = std::min(best[m], std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  for (int m = 1; m <= 8; ++m) std::printf("K=%ld %d rows %.2f ms (%.2fx one row)\n", (long)K, m, best[m], best[m] / best[1]);
}
