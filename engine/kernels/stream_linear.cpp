// The weight-streaming products as torch ops (the tests, the layer path's Linear and QuantLinear): the
// bodies are core/linear.h's; here x, W and y are checked, and output rows split between torch's threads.
// Included by module.cpp, the one translation unit of the native kernels.
#pragma once
#include "torch_common.h"
#include "core/linear.h"
#include "core/linear_tiles.h"
#include "core/dequant.h"

using namespace inferlab;

// Output rows per thread task: whole cache lines of y, and enough work to be worth a task.
static int64_t grain(int64_t N) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>(16, (N / threads + 15) / 16 * 16);
}

// The bias as float32 (an empty tensor when there is none).
static torch::Tensor bias_f32(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return torch::Tensor();
  TORCH_CHECK(bias->numel() == N, "bias (N,)");
  return bias->to(torch::kFloat32).contiguous();
}

// Raw entry: x (M, K), w (N, K) -> y (M, N), bias float32 or null. (The fused decode step calls
// bf16_rows_for itself, on each thread's share of the rows.)
static void linear_bf16(const uint16_t* xp, int64_t M, const uint16_t* wp, const float* bp, int64_t K, int64_t N,
                        uint16_t* yp) {
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) { bf16_rows_any(xp, M, wp, yp, bp, K, N, n0, n1); });
}

// x (M, K) bf16, w (N, K) bf16 -> (M, N) bf16 (+ bias), float32 sums; more than 8 rows in chunks of 8 over
// blocks of W (bf16_rows_any), each row's result the one it has alone.
torch::Tensor stream_linear_bf16(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16 x and W only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x (M, K) and W (N, K)");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1, "stream_linear_bf16 takes at least one row");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  auto y = torch::empty({M, N}, x.options());
  auto bf = bias_f32(bias, N);
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  linear_bf16(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, reinterpret_cast<const uint16_t*>(wc.data_ptr()),
              bp, K, N, reinterpret_cast<uint16_t*>(y.data_ptr()));
  return y;
}

// 4-bit weights of K columns: codes (N, K / 2) uint8, sz (N, K / group, 2) bf16, K a multiple of 64 and of the
// group (a power of two, at least 32); in the tiles layout (core/linear_tiles.h) N a multiple of 16 too.
static void check_int4_weights(const torch::Tensor& codes, const torch::Tensor& sz, int64_t group, int64_t K,
                               bool tiles) {
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && codes.scalar_type() == at::kByte && codes.dim() == 2,
              "bf16 scales, uint8 codes (N, K / 2)");
  const int64_t N = codes.size(0);
  TORCH_CHECK(codes.size(1) * 2 == K && K % 64 == 0 && group >= 32 && (group & (group - 1)) == 0 && K % group == 0 &&
                  (!tiles || N % kRowTile == 0) && sz.numel() == N * (K / group) * 2,
              tiles ? "int4 tiles: codes (N, K / 2) with N a multiple of 16, sz (N, K / group, 2); K a multiple of 64 "
                      "and of the group (a power of two, at least 32)"
                    : "int4: codes (N, K / 2), sz (N, K / group, 2); K a multiple of 64 and of the group (a power of "
                      "two, at least 32)");
}

static void linear_int4(const uint16_t* xp, int64_t M, const uint8_t* cp, const uint16_t* szp, int64_t group,
                        const float* bp, int64_t K, int64_t N, uint16_t* yp, float* gx, uint16_t* xperm) {
  int4_prepare(xp, M, K, group, gx, xperm);
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) {
    int4_range(xp, M, cp, szp, group, bp, K, N, yp, gx, xperm, n0, n1);
  });
}

// x (M, K) bf16, codes (N, K / 2) uint8 in the chunk layout above, sz (N, K / group, 2) bf16
// -> (M, N) bf16 (+ bias). K a multiple of 64 and of the group size; group a multiple of 32.
torch::Tensor stream_linear_int4(torch::Tensor x, torch::Tensor codes, torch::Tensor sz, int64_t group,
                                 c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "bf16 x (M, K)");
  check_int4_weights(codes, sz, group, x.size(1), false);
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  auto xc = x.contiguous();
  auto cc = codes.contiguous();
  auto szc = sz.contiguous();
  auto y = torch::empty({M, N}, x.options());
  auto bf = bias_f32(bias, N);
  std::vector<float> gx(M * 2 * (K / group));
  std::vector<uint16_t> xperm(M * K);
  linear_int4(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, cc.data_ptr<uint8_t>(),
              reinterpret_cast<const uint16_t*>(szc.data_ptr()), group, bf.defined() ? bf.data_ptr<float>() : nullptr,
              K, N, reinterpret_cast<uint16_t*>(y.data_ptr()), gx.data(), xperm.data());
  return y;
}

// x (M, K) bf16 against 4-bit weights in the tiles layout.
static void check_tiles(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& sz, int64_t group) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(0) >= 1, "bf16 x (M, K)");
  check_int4_weights(codes, sz, group, x.size(1), true);
}

// x (M, K) bf16, codes and sz in the tiles layout -> (M, N) bf16 (+ bias), x in float32 (exact).
torch::Tensor stream_linear_int4_tiles(torch::Tensor x, torch::Tensor codes, torch::Tensor sz, int64_t group,
                                       c10::optional<torch::Tensor> bias) {
  check_tiles(x, codes, sz, group);
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  auto xc = x.contiguous(), cc = codes.contiguous(), szc = sz.contiguous();
  auto y = torch::empty({M, N}, x.options());
  auto bf = bias_f32(bias, N);
  std::vector<float> scratch(f4t_scratch_floats(M, K));
  int4t_prepare(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, K, group, scratch.data());
  const uint8_t* cp = cc.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(szc.data_ptr());
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) {
    int4t_range(scratch.data(), M, cp, sp, group, bp, K, N, yp, n0, n1);
  });
  return y;
}

// The same with x rounded to int8 per 32 columns (the fused step's product; here for the tests).
torch::Tensor stream_linear_int4_tiles_q8(torch::Tensor x, torch::Tensor codes, torch::Tensor sz, int64_t group) {
  check_tiles(x, codes, sz, group);
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  auto xc = x.contiguous(), cc = codes.contiguous(), szc = sz.contiguous();
  auto y = torch::empty({M, N}, x.options());
  std::vector<float> scratch(q4t_scratch_floats(M, K));
  std::vector<Q4t> xs(M);
  int4t_q8_prepare(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, K, group, scratch.data(), xs.data());
  const uint8_t* cp = cc.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(szc.data_ptr());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) {
    int4t_q8_range(xs.data(), M, cp, sp, group, nullptr, K, N, yp, n0, n1);
  });
  return y;
}

static void linear_int8(const uint16_t* x, int64_t M, const int8_t* qp, const uint16_t* sp, const float* bp,
                        int64_t K, int64_t N, uint16_t* yp, float* xf) {
  int8_prepare(x, M, K, xf);
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) { int8_range(xf, M, qp, sp, bp, K, N, yp, n0, n1); });
}

// x (M, K) bf16 with M <= 8, q (N, K) int8, scales (N,) bf16 -> (M, N) bf16 (+ bias).
torch::Tensor stream_linear_int8(torch::Tensor x, torch::Tensor q, torch::Tensor scales,
                                 c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && scales.scalar_type() == at::kBFloat16, "bf16 x and scales");
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && x.dim() == 2 && x.size(1) == q.size(1),
              "x (M, K), int8 q (N, K)");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(M >= 1 && M <= kMaxRows && scales.numel() == N, "1 to 8 rows; scales (N,)");
  auto xc = x.contiguous();
  auto qc = q.contiguous();
  auto sc = scales.contiguous();
  auto y = torch::empty({M, N}, x.options());
  auto bf = bias_f32(bias, N);
  std::vector<float> xf(M * K);
  linear_int8(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, qc.data_ptr<int8_t>(),
              reinterpret_cast<const uint16_t*>(sc.data_ptr()), bf.defined() ? bf.data_ptr<float>() : nullptr, K, N,
              reinterpret_cast<uint16_t*>(y.data_ptr()), xf.data());
  return y;
}

static void linear_int4_q8(const uint16_t* xp, int64_t M, const uint8_t* cp, const uint16_t* szp, int64_t group,
                           const float* bp, int64_t K, int64_t N, uint16_t* yp, float* scratch) {
  std::vector<Q4x> xs(M);
  int4_q8_prepare(xp, M, K, group, scratch, xs.data());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) {
    int4_q8_range(xs.data(), M, cp, szp, group, bp, K, N, yp, n0, n1);
  });
}

static void linear_int8_q8(const uint16_t* x, int64_t M, const int8_t* qp, const uint16_t* sp, const float* bp,
                           int64_t K, int64_t N, uint16_t* yp, float* scratch) {
  std::vector<Q8x> xs(M);
  int8_q8_prepare(x, M, K, scratch, xs.data());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) {
    int8_q8_range(xs.data(), M, qp, sp, bp, K, N, yp, n0, n1);
  });
}

// The two as tensor ops (the tests; the fused step calls the raw entries).
torch::Tensor stream_linear_int4_q8(torch::Tensor x, torch::Tensor codes, torch::Tensor sz, int64_t group) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "bf16 x (M, K)");
  check_int4_weights(codes, sz, group, x.size(1), false);
  TORCH_CHECK(group <= 128, "the int8-activation int4 product takes groups of 32 to 128");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  auto xc = x.contiguous(), cc = codes.contiguous(), szc = sz.contiguous();
  auto y = torch::empty({M, N}, x.options());
  std::vector<float> scratch(q4_scratch_floats(M, K));
  linear_int4_q8(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, cc.data_ptr<uint8_t>(),
                 reinterpret_cast<const uint16_t*>(szc.data_ptr()), group, nullptr, K, N,
                 reinterpret_cast<uint16_t*>(y.data_ptr()), scratch.data());
  return y;
}

torch::Tensor stream_linear_int8_q8(torch::Tensor x, torch::Tensor q, torch::Tensor scales) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && scales.scalar_type() == at::kBFloat16 && q.scalar_type() == at::kChar,
              "bf16 x and scales, int8 q");
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1) && x.size(0) >= 1 &&
                  scales.numel() == q.size(0), "x (M, K), q (N, K), scales (N,)");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  auto xc = x.contiguous(), qc = q.contiguous(), sc = scales.contiguous();
  auto y = torch::empty({M, N}, x.options());
  std::vector<float> scratch(q8_scratch_floats(M, K));
  linear_int8_q8(reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, qc.data_ptr<int8_t>(),
                 reinterpret_cast<const uint16_t*>(sc.data_ptr()), nullptr, K, N,
                 reinterpret_cast<uint16_t*>(y.data_ptr()), scratch.data());
  return y;
}

// q (N, K) int codes 0..15 -> (N, K / 2) uint8 in the chunk layout.
torch::Tensor pack_int4(torch::Tensor q) {
  TORCH_CHECK(q.dim() == 2 && q.size(1) % 32 == 0, "q (N, K) with K a multiple of 32");
  auto qc = q.to(torch::kUInt8).contiguous();
  const int64_t N = qc.size(0), K = qc.size(1);
  auto out = torch::empty({N, K / 2}, qc.options());
  const uint8_t* src = qc.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < K / 32; ++c)
      for (int j = 0; j < 16; ++j) {
        const uint8_t lo = src[n * K + c * 32 + j] & 0x0F, hi = src[n * K + c * 32 + 16 + j] & 0x0F;
        dst[n * (K / 2) + c * 16 + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
  return out;
}

// The quantized weights back to bf16 (core/dequant.h), into `out` (bf16, contiguous, reused by the caller:
// a scratch buffer), bit for bit the reference's weight; returns `out`. Prompt rows on a CPU with native
// bf16 multiply it with the library GEMM (engine/quant/schemes.py).
static void check_out(const torch::Tensor& out, int64_t rows, int64_t cols) {
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.dim() == 2 && out.size(0) == rows &&
                  out.size(1) == cols,
              "out must be a contiguous bf16 tensor of shape (", rows, ", ", cols, ")");
}

// The tiles layout into W: out (N, K).
torch::Tensor dequant_int4_tiles(torch::Tensor codes, torch::Tensor sz, int64_t group, torch::Tensor out) {
  TORCH_CHECK(codes.dim() == 2, "codes (N, K / 2)");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  check_int4_weights(codes, sz, group, K, true);
  check_out(out, N, K);
  auto cc = codes.contiguous(), szc = sz.contiguous();
  const uint8_t* cp = cc.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(szc.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) { int4t_dequant(cp, sp, K, group, op, n0, n1); });
  return out;
}

// The chunk layout into W: out (N, K).
torch::Tensor dequant_int4(torch::Tensor codes, torch::Tensor sz, int64_t group, torch::Tensor out) {
  TORCH_CHECK(codes.dim() == 2, "codes (N, K / 2)");
  const int64_t N = codes.size(0), K = codes.size(1) * 2;
  check_int4_weights(codes, sz, group, K, false);
  check_out(out, N, K);
  auto cc = codes.contiguous(), szc = sz.contiguous();
  const uint8_t* cp = cc.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(szc.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) { int4_dequant(cp, sp, K, group, op, n0, n1); });
  return out;
}

// int8 rows with one bf16 scale each into W: out (N, K).
torch::Tensor dequant_int8(torch::Tensor q, torch::Tensor scales, torch::Tensor out) {
  TORCH_CHECK(q.scalar_type() == at::kChar && scales.scalar_type() == at::kBFloat16, "int8 q, bf16 scales");
  TORCH_CHECK(q.dim() == 2 && scales.numel() == q.size(0), "q (N, K), scales (N,)");
  const int64_t N = q.size(0), K = q.size(1);
  check_out(out, N, K);
  auto qc = q.contiguous(), sc = scales.contiguous();
  const int8_t* qp = qc.data_ptr<int8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sc.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  inferlab::parallel_for(0, N, grain(N), [&](int64_t n0, int64_t n1) { int8_dequant(qp, sp, K, op, n0, n1); });
  return out;
}
