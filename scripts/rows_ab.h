// What the two A/B drivers share (scripts/bf16_rows_ab.cpp, scripts/int4_rows_ab.cpp): one huge-page arena for
// the weights, and the alternating sweeps with their table (median and minimum of each build, each row count
// against its own 1 row, and B / A).
#pragma once
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

// `total` bytes starting on a 2 MiB boundary, advised MADV_HUGEPAGE (as the engine keeps its weights).
inline char* huge_arena(size_t total) {
  const size_t huge = size_t{2} << 20;
  char* raw = static_cast<char*>(mmap(nullptr, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* arena = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
  madvise(arena, total, MADV_HUGEPAGE);
  return arena;
}

// sweep_a(M) / sweep_b(M): one pass of build A / B over every matrix with M rows of x. Sweeps alternate which
// build goes first; M runs 1..max_rows.
template <class FA, class FB>
void ab_table(int max_rows, int sweeps, FA sweep_a, FB sweep_b, const char* fmt_ms = "%8.2f (%6.2f)") {
  auto timed = [](auto fn, int M) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(M);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<std::vector<double>> ta(max_rows + 1), tb(max_rows + 1);
  for (int s = 0; s < sweeps; ++s)
    for (int M = 1; M <= max_rows; ++M) {
      if (s % 2) {
        tb[M].push_back(timed(sweep_b, M));
        ta[M].push_back(timed(sweep_a, M));
      } else {
        ta[M].push_back(timed(sweep_a, M));
        tb[M].push_back(timed(sweep_b, M));
      }
    }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  auto low = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf("rows  A median (min) ms  x A's 1 row | B median (min) ms  x B's 1 row | B / A\n");
  for (int M = 1; M <= max_rows; ++M) {
    std::printf("%4d  ", M);
    std::printf(fmt_ms, med(ta[M]), low(ta[M]));
    std::printf("  %5.2fx      | ", med(ta[M]) / med(ta[1]));
    std::printf(fmt_ms, med(tb[M]), low(tb[M]));
    std::printf("  %5.2fx      | %.2f\n", med(tb[M]) / med(tb[1]), med(tb[M]) / med(ta[M]));
  }
}
