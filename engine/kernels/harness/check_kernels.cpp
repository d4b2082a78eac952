// A torch-free check of the native kernels' bodies for the tier this file is compiled for (core/isa.h):
// every product, the paged attention and the small ops on seeded random inputs, against a plain
// double-precision reference written here. It runs where torch cannot: under qemu-aarch64 for the NEON
// body (tests/test_kernel_tiers.py cross-compiles it), and natively for each x86 tier.
//
//   g++ -O2 -std=c++17 [tier flags] -I engine/kernels harness/check_kernels.cpp -o check && ./check
// Prints one line per check and "N passed, M failed"; exits 1 on a failure.
#include <cstdio>
#include <random>
#include <string>
#include <tuple>

#include "core/attention.h"
#include "core/dequant.h"
#include "core/linear.h"
#include "core/linear_tiles.h"
#include "core/ops.h"
#include "core/rows.h"

using namespace inferlab;

namespace {

int passed = 0, failed = 0;
std::mt19937 rng(1234);

float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
std::vector<uint16_t> bf16_vec(int64_t n, float a = -1.f, float b = 1.f) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(uniform(a, b));
  return v;
}

// |got - want| within tol * (1 + |want|), element by element; one line of output per check.
void expect_close(const std::string& what, const std::vector<uint16_t>& got, const std::vector<double>& want,
                  double tol) {
  double worst = 0.0;
  int64_t at = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_float(got[i]);
    const double err = std::fabs(g - want[i]) / (1.0 + std::fabs(want[i]));
    if (!(err <= worst)) worst = err, at = static_cast<int64_t>(i);  // NaN counts as the worst
  }
  const bool ok = worst <= tol;
  (ok ? passed : failed)++;
  std::printf("%s %-46s worst relative error %.2e%s\n", ok ? "ok  " : "FAIL", what.c_str(), worst,
              ok ? "" : (" at " + std::to_string(at)).c_str());
}

void check_bf16(int64_t M, int64_t K, int64_t N) {
  const auto x = bf16_vec(M * K), w = bf16_vec(N * K, -0.2f, 0.2f);
  std::vector<float> bias(N);
  for (auto& b : bias) b = uniform(-1.f, 1.f);
  std::vector<uint16_t> y(M * N);
  bf16_rows_for(M)(x.data(), w.data(), y.data(), bias.data(), K, N, 0, N);
  std::vector<double> want(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias[n];
      for (int64_t k = 0; k < K; ++k) s += double(bf16_to_float(x[m * K + k])) * bf16_to_float(w[n * K + k]);
      want[m * N + n] = s;
    }
  expect_close("bf16 rows M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N), y, want,
               1e-2);
}

// 4-bit codes in the kernel's chunk layout (core/linear.h) and their (scale, zero) per group.
struct Int4W {
  std::vector<uint8_t> q, codes;
  std::vector<uint16_t> sz;
};
Int4W make_int4(int64_t N, int64_t K, int64_t group) {
  Int4W w;
  w.q.resize(N * K);
  for (auto& v : w.q) v = static_cast<uint8_t>(rng() % 16);
  w.codes.resize(N * K / 2);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < K / 32; ++c)
      for (int j = 0; j < 16; ++j)
        w.codes[n * (K / 2) + c * 16 + j] =
            static_cast<uint8_t>(w.q[n * K + c * 32 + j] | (w.q[n * K + c * 32 + 16 + j] << 4));
  w.sz = bf16_vec(N * (K / group) * 2, -0.05f, 0.05f);
  return w;
}
double int4_weight(const Int4W& w, int64_t n, int64_t k, int64_t K, int64_t group) {
  const int64_t g = k / group, pairs = 2 * (K / group);
  return (double(w.q[n * K + k]) - 8.0) * bf16_to_float(w.sz[n * pairs + 2 * g]) + bf16_to_float(w.sz[n * pairs + 2 * g + 1]);
}

// x (M, K) times the int4 weights in double (+ bias): with x exact (want) and with x as the int8 bodies
// round it, per 32 columns d * xq (want8).
void int4_reference(const std::vector<uint16_t>& x, const Int4W& w, int64_t M, int64_t K, int64_t N, int64_t group,
                    const float* bias, std::vector<double>& want, std::vector<double>& want8) {
  std::vector<int8_t> xq(K + 128);
  std::vector<float> d(K / 32 + 8);
  want.assign(M * N, 0.0);
  want8.assign(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    quantize_row_q8(x.data() + m * K, K, xq.data(), d.data());
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? bias[n] : 0.0, s8 = s;
      for (int64_t k = 0; k < K; ++k) {
        const double wk = int4_weight(w, n, k, K, group);
        s += wk * bf16_to_float(x[m * K + k]);
        s8 += wk * double(d[k / 32]) * xq[k];
      }
      want[m * N + n] = s;
      want8[m * N + n] = s8;
    }
  }
}

void check_int4(int64_t M, int64_t K, int64_t N, int64_t group) {
  const auto x = bf16_vec(M * K);
  const Int4W w = make_int4(N, K, group);
  std::vector<uint16_t> y(M * N), y8(M * N);
  std::vector<float> gx(M * 2 * (K / group));
  std::vector<uint16_t> xperm(M * K);
  int4_prepare(x.data(), M, K, group, gx.data(), xperm.data());
  int4_range(x.data(), M, w.codes.data(), w.sz.data(), group, nullptr, K, N, y.data(), gx.data(), xperm.data(), 0, N);
  std::vector<float> scratch(q4_scratch_floats(M, K));
  std::vector<Q4x> xs(M);
  int4_q8_prepare(x.data(), M, K, group, scratch.data(), xs.data());
  int4_q8_range(xs.data(), M, w.codes.data(), w.sz.data(), group, nullptr, K, N, y8.data(), 0, N);
  std::vector<double> want, want8;
  int4_reference(x, w, M, K, N, group, nullptr, want, want8);
  const std::string shape = " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                            " g=" + std::to_string(group);
  expect_close("int4 rows" + shape, y, want, 1e-2);
  expect_close("int4 rows, int8 activations" + shape, y8, want8, 1e-2);
}

// The same weights in the tiles layout (core/linear_tiles.h): codes per tile of 16 rows, per group, per
// step of 8 columns; scales and zeros per tile and group, 16 of each.
void to_tiles(const Int4W& w, int64_t N, int64_t K, int64_t group, std::vector<uint8_t>& codes,
              std::vector<uint16_t>& sz) {
  const int64_t G = K / group;
  codes.assign(N * K / 2, 0);
  sz.assign(N * G * 2, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = n / 16, j = n % 16, g = k / group, s = (k % group) / 8, i = k % 8;
      uint8_t& b = codes[t * 16 * (K / 2) + g * group * 8 + s * 64 + 4 * j + i % 4];
      b |= static_cast<uint8_t>(w.q[n * K + k] << (i < 4 ? 0 : 4));
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = ((n / 16) * G + g) * 32 + n % 16;
      sz[at] = w.sz[n * 2 * G + 2 * g];
      sz[at + 16] = w.sz[n * 2 * G + 2 * g + 1];
    }
}

// Both tiles products against the reference; every row of x as it is alone (bit for bit); and rows
// [16, N) alone (a thread's share) as in the whole call.
void check_int4_tiles(int64_t M, int64_t K, int64_t N, int64_t group) {
  const auto x = bf16_vec(M * K);
  const Int4W w = make_int4(N, K, group);
  std::vector<uint8_t> codes;
  std::vector<uint16_t> sz;
  to_tiles(w, N, K, group, codes, sz);
  std::vector<float> bias(N);
  for (auto& b : bias) b = uniform(-1.f, 1.f);
  auto run = [&](int64_t rows, const uint16_t* xr, bool q8, int64_t n0, std::vector<uint16_t>& y) {
    y.assign(rows * N, 0);
    if (q8) {
      std::vector<float> scratch(q4t_scratch_floats(rows, K));
      std::vector<Q4t> xs(rows);
      int4t_q8_prepare(xr, rows, K, group, scratch.data(), xs.data());
      int4t_q8_range(xs.data(), rows, codes.data(), sz.data(), group, bias.data(), K, N, y.data(), n0, N);
    } else {
      std::vector<float> scratch(f4t_scratch_floats(rows, K));
      int4t_prepare(xr, rows, K, group, scratch.data());
      int4t_range(scratch.data(), rows, codes.data(), sz.data(), group, bias.data(), K, N, y.data(), n0, N);
    }
  };
  std::vector<double> want, want8;
  int4_reference(x, w, M, K, N, group, bias.data(), want, want8);
  const std::string shape = " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                            " g=" + std::to_string(group);
  for (bool q8 : {false, true}) {
    std::vector<uint16_t> y, alone, part;
    run(M, x.data(), q8, 0, y);
    expect_close(std::string(q8 ? "int4 tiles, int8 activations" : "int4 tiles") + shape, y, q8 ? want8 : want, 1e-2);
    int64_t differ = 0;
    for (int64_t m = 0; m < M; ++m) {
      run(1, x.data() + m * K, q8, 0, alone);
      for (int64_t n = 0; n < N; ++n) differ += alone[n] != y[m * N + n];
    }
    run(M, x.data(), q8, 16, part);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 16; n < N; ++n) differ += part[m * N + n] != y[m * N + n];
    (differ == 0 ? passed : failed)++;
    std::printf("%s %-46s %lld differ\n", differ == 0 ? "ok  " : "FAIL",
                (std::string(q8 ? "int4 tiles q8" : "int4 tiles") + " alone = together" + shape).c_str(),
                static_cast<long long>(differ));
  }
}

// The weights dequantized to bf16 (core/dequant.h), both int4 layouts and int8, bit for bit as the
// reference rounds them: (q - 8) s + zero (or q s) in float32, then to bf16 (nearest even).
void check_dequant(int64_t K, int64_t N, int64_t group) {
  const Int4W w = make_int4(N, K, group);
  std::vector<uint8_t> codes;
  std::vector<uint16_t> sz;
  to_tiles(w, N, K, group, codes, sz);
  const int64_t pairs = 2 * (K / group);
  std::vector<uint16_t> want(N * K), chunks(N * K, 0xFFFF), tiles(N * K, 0xFFFF);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / group;
      want[n * K + k] = float_to_bf16(static_cast<float>(int(w.q[n * K + k]) - 8) * bf16_to_float(w.sz[n * pairs + 2 * g]) +
                                      bf16_to_float(w.sz[n * pairs + 2 * g + 1]));
    }
  int4_dequant(w.codes.data(), w.sz.data(), K, group, chunks.data(), 0, N);
  int4t_dequant(codes.data(), sz.data(), K, group, tiles.data(), 0, 16);  // a thread's share, then the rest
  int4t_dequant(codes.data(), sz.data(), K, group, tiles.data(), 16, N);
  std::vector<int8_t> q(N * K);
  for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  const auto scales = bf16_vec(N, -0.05f, 0.05f);
  std::vector<uint16_t> want8(N * K), got8(N * K, 0xFFFF);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) want8[n * K + k] = float_to_bf16(static_cast<float>(q[n * K + k]) * bf16_to_float(scales[n]));
  int8_dequant(q.data(), scales.data(), K, got8.data(), 0, N);
  const std::string shape = " K=" + std::to_string(K) + " N=" + std::to_string(N) + " g=" + std::to_string(group);
  for (const auto& [what, got, ref] : {std::make_tuple("dequant int4 chunks", &chunks, &want),
                                       std::make_tuple("dequant int4 tiles", &tiles, &want),
                                       std::make_tuple("dequant int8", &got8, &want8)}) {
    int64_t differ = 0;
    for (int64_t i = 0; i < N * K; ++i) differ += (*got)[i] != (*ref)[i];
    (differ == 0 ? passed : failed)++;
    std::printf("%s %-46s %lld differ\n", differ == 0 ? "ok  " : "FAIL", (std::string(what) + shape).c_str(),
                static_cast<long long>(differ));
  }
}

void check_int8(int64_t M, int64_t K, int64_t N) {
  const auto x = bf16_vec(M * K);
  std::vector<int8_t> q(N * K);
  for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  const auto scales = bf16_vec(N, 0.001f, 0.01f);
  std::vector<uint16_t> y(M * N), y8(M * N);
  std::vector<float> xf(M * K);
  int8_prepare(x.data(), M, K, xf.data());
  int8_range(xf.data(), M, q.data(), scales.data(), nullptr, K, N, y.data(), 0, N);
  std::vector<float> scratch(q8_scratch_floats(M, K));
  Q8x xs[kMaxRows];
  int8_q8_prepare(x.data(), M, K, scratch.data(), xs);
  int8_q8_range(xs, M, q.data(), scales.data(), nullptr, K, N, y8.data(), 0, N);
  std::vector<int8_t> xq(K + 64);
  std::vector<float> d(K / 32 + 8);
  std::vector<double> want(M * N), want8(M * N);
  for (int64_t m = 0; m < M; ++m) {
    quantize_row_q8(x.data() + m * K, K, xq.data(), d.data());
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0, s8 = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        s += double(q[n * K + k]) * bf16_to_float(x[m * K + k]);
        s8 += double(q[n * K + k]) * double(d[k / 32]) * xq[k];
      }
      want[m * N + n] = s * bf16_to_float(scales[n]);
      want8[m * N + n] = s8 * bf16_to_float(scales[n]);
    }
  }
  const std::string shape = " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
  expect_close("int8 rows" + shape, y, want, 1e-2);
  expect_close("int8 rows, int8 activations" + shape, y8, want8, 1e-2);
}

void check_attention(int64_t D, int64_t group, int64_t len, int64_t block_size) {
  const int64_t blocks = (len + block_size - 1) / block_size + 2, slots = blocks * block_size;
  const auto q = bf16_vec(group * D, -0.5f, 0.5f), kc = bf16_vec(slots * D), vc = bf16_vec(slots * D);
  std::vector<int64_t> bt(blocks);
  for (int64_t i = 0; i < blocks; ++i) bt[i] = blocks - 1 - i;  // blocks out of order, as a paged cache has them
  std::vector<float> scores;
  std::vector<float> acc(8 * 128);
  std::vector<uint16_t> o(group * D);
  attend(q.data(), kc.data(), vc.data(), bt.data(), len, block_size, group, D, scores, acc, o.data());
  std::vector<double> want(group * D, 0.0);
  auto row = [&](const std::vector<uint16_t>& c, int64_t t, int64_t j) {
    return double(bf16_to_float(c[(bt[t / block_size] * block_size + t % block_size) * D + j]));
  };
  for (int64_t g = 0; g < group; ++g) {
    std::vector<double> s(len);
    double mx = -1e300, sum = 0.0;
    for (int64_t t = 0; t < len; ++t) {
      double dot = 0.0;
      for (int64_t j = 0; j < D; ++j) dot += double(bf16_to_float(q[g * D + j])) * row(kc, t, j);
      s[t] = dot;
      mx = std::max(mx, dot);
    }
    for (auto& v : s) sum += (v = std::exp(v - mx));
    for (int64_t t = 0; t < len; ++t)
      for (int64_t j = 0; j < D; ++j) want[g * D + j] += s[t] / sum * row(vc, t, j);
  }
  expect_close("paged attention D=" + std::to_string(D) + " group=" + std::to_string(group) +
                   " len=" + std::to_string(len), o, want, 1e-2);
}

void check_silu_mul(int64_t n) {
  const auto g = bf16_vec(n, -8.f, 8.f), u = bf16_vec(n, -2.f, 2.f);
  std::vector<uint16_t> act(n);
  silu_mul(g.data(), u.data(), act.data(), 0, n);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    const double gv = bf16_to_float(g[i]);
    want[i] = gv / (1.0 + std::exp(-gv)) * bf16_to_float(u[i]);
  }
  expect_close("silu(gate) * up n=" + std::to_string(n), act, want, 2e-2);
}

// greedy_token: the first index of the largest value (as a plain scan), -1 where one value is NaN or +-inf.
void check_greedy(int64_t n) {
  std::vector<float> row(n);
  for (auto& x : row) x = uniform(-5.f, 5.f);
  const auto scan = [&](const char* what, int64_t want) {
    const int64_t got = greedy_token(row.data(), n);
    const bool ok = got == want;
    (ok ? passed : failed)++;
    std::printf("%s greedy n=%lld %s: %lld (want %lld)\n", ok ? "ok  " : "FAIL", static_cast<long long>(n), what,
                static_cast<long long>(got), static_cast<long long>(want));
  };
  int64_t first = 0;
  for (int64_t i = 1; i < n; ++i) first = row[i] > row[first] ? i : first;
  scan("random", first);
  row[n - 1] = row[n / 3] = 9.f;  // a tie: the first index
  scan("tie", n / 3 < n - 1 ? n / 3 : n - 1);
  const float bad[] = {NAN, INFINITY, -INFINITY};
  for (float b : bad) {
    const float keep = row[n / 2];
    row[n / 2] = b;
    scan(std::isnan(b) ? "NaN" : b > 0 ? "+inf" : "-inf", -1);
    row[n / 2] = keep;
  }
}

// sampled_token: the token a double-precision inverse CDF of softmax((x - max) / t) draws with the same u
// (u put mid-way into the share of a token of some mass: away from a boundary), -1 where one value is NaN or
// +-inf.
void check_sampled(int64_t n) {
  std::vector<float> row(n), sums(n / kGreedyBlock + 1);
  for (auto& x : row) x = uniform(-5.f, 5.f);
  const float t = 0.7f;
  const float mx = *std::max_element(row.begin(), row.end());
  std::vector<double> mass(n);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += (mass[i] = std::exp((double(row[i]) - mx) / t));
  int ok = 0, tried = 0;
  for (int64_t q = 0; q < 4; ++q) {  // the top token of each quarter: a share far wider than the rounding
    const int64_t lo = q * n / 4, hi = std::max((q + 1) * n / 4, lo + 1);
    const int64_t want = std::max_element(row.begin() + lo, row.begin() + std::min(hi, n)) - row.begin();
    double before = 0.0;
    for (int64_t i = 0; i < want; ++i) before += mass[i];
    const double u = (before + mass[want] / 2) / total;
    ++tried;
    ok += sampled_token(row.data(), n, t, u, sums.data()) == want;
  }
  row[n / 2] = NAN;
  ++tried;
  ok += sampled_token(row.data(), n, t, 0.5, sums.data()) == -1;
  (ok == tried ? passed : failed)++;
  std::printf("%s sampled n=%lld: %d of %d draws as the reference\n", ok == tried ? "ok  " : "FAIL",
              static_cast<long long>(n), ok, tried);
}

}  // namespace

// Each row of M rows computed together is bit for bit the row computed alone (a verify's rows, a batch's
// rows: the same logits as one-row decoding, so speculation and batching never change a greedy token).
void check_bf16_rows_alone(int64_t M, int64_t K, int64_t N) {
  const auto x = bf16_vec(M * K), w = bf16_vec(N * K, -0.2f, 0.2f);
  std::vector<uint16_t> together(M * N), alone(N);
  bf16_rows_any(x.data(), M, w.data(), together.data(), nullptr, K, N, 0, N);
  int64_t differ = 0;
  for (int64_t m = 0; m < M; ++m) {
    bf16_rows_for(1)(x.data() + m * K, w.data(), alone.data(), nullptr, K, N, 0, N);
    for (int64_t n = 0; n < N; ++n) differ += together[m * N + n] != alone[n];
  }
  (differ == 0 ? passed : failed)++;
  std::printf("%s %-46s %lld of %lld differ\n", differ == 0 ? "ok  " : "FAIL",
              ("bf16 rows alone = together M=" + std::to_string(M) + " K=" + std::to_string(K)).c_str(),
              static_cast<long long>(differ), static_cast<long long>(M * N));
}

// The two walks of W (kBf16Tiles, kBf16Rows: which one runs is measured per CPU) give the same numbers,
// bit for bit, for every row count (so the choice never changes an answer).
void check_bf16_bodies_agree(int64_t M, int64_t K, int64_t N) {
  const auto x = bf16_vec(M * K), w = bf16_vec(N * K, -0.2f, 0.2f);
  std::vector<float> bias(N);
  for (auto& b : bias) b = uniform(-1.f, 1.f);
  std::vector<uint16_t> tiles(M * N), rows(M * N);
  bf16_rows_for(M, kBf16Tiles)(x.data(), w.data(), tiles.data(), bias.data(), K, N, 0, N);
  bf16_rows_for(M, kBf16Rows)(x.data(), w.data(), rows.data(), bias.data(), K, N, 0, N);
  int64_t differ = 0;
  for (int64_t i = 0; i < M * N; ++i) differ += tiles[i] != rows[i];
  (differ == 0 ? passed : failed)++;
  std::printf("%s %-46s %lld of %lld differ\n", differ == 0 ? "ok  " : "FAIL",
              ("bf16 tiles = rows M=" + std::to_string(M) + " K=" + std::to_string(K)).c_str(),
              static_cast<long long>(differ), static_cast<long long>(M * N));
}

int main() {
  std::printf("tier: %s\n", tier_name());
  for (int64_t M = 1; M <= 8; ++M)
    for (int64_t K : {576, 72, 13}) check_bf16_bodies_agree(M, K, 23);
  for (int64_t M : {1, 2, 3, 5, 8}) {
    check_bf16(M, 576, 67);
    check_bf16(M, 72, 9);  // K not a multiple of 8 or 32: the tails
  }
  for (int64_t M : {2, 3, 4, 5, 6, 7, 8})  // every body sums each row as the row alone
    for (int64_t K : {576, 200, 1536, 13}) check_bf16_rows_alone(M, K, 23);
  for (int64_t M : {13, 20}) check_bf16_rows_alone(M, 200, 150);  // chunks over blocks of 64 weight rows
  check_bf16_rows_alone(16, 576, 67);  // AVX-512: whole 4 x 4 tiles (their 16 sums at once), a tail of 3 rows
  check_bf16_rows_alone(33, 1536, 130);
  for (int64_t M : {1, 2, 4, 5}) {
    check_int4(M, 576, 37, 32);
    check_int4(M, 320, 12, 64);  // a half 128-column block at the end; two groups per block
    check_int4(M, 256, 9, 128);
    check_int4_tiles(M, 576, 48, 32);
    check_int4_tiles(M, 320, 32, 64);
    check_int4_tiles(M, 256, 16, 128);
  }
  check_dequant(576, 48, 32);
  check_dequant(320, 32, 64);
  check_dequant(256, 16, 128);
  for (int64_t M : {1, 3, 8}) {
    check_int8(M, 576, 41);
    check_int8(M, 200, 7);  // a partial 32-column block
  }
  for (int64_t D : {64, 128})
    for (int64_t group : {1, 3, 8}) {
      check_attention(D, group, 1, 16);
      check_attention(D, group, 37, 16);
      check_attention(D, group, 300, 32);
    }
  check_silu_mul(1536);
  check_silu_mul(13);
  for (int64_t n : {1, 63, 64, 65, 200, 49152}) check_greedy(n);
  for (int64_t n : {1, 7, 256, 300, 49152}) check_sampled(n);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
