// One native call per step: the whole transformer for any number of rows on the CPU (decodes, a verify's
// chained rows, a prompt chunk's tokens), bf16 activations, a 16-bit paged KV cache (EngineConfig.fused_decode;
// engine/runner/fused.py builds it). A row's numbers never depend on the rows beside it: each product sums
// each row alone in one order (bf16: up to 8 rows a pass over W, more over blocks of W in cache; quantized:
// 8 rows a pass), attention is per row, and norms are per row; the logits are taken for the rows asked only.
//
// The eager path runs ~360 small torch ops per step (norms, RoPE, KV writes, casts, splits) between
// the Linear layers; each costs microseconds of dispatch, which at one stream is as long as reading
// the weights. Here every small op is a raw-pointer loop over preallocated scratch, and the matrix-
// vector products and the attention are the same bodies the separate kernels run: this file is one
// translation unit with stream_linear.cpp and paged_decode.cpp (module.cpp), so nothing is copied.
//
// Threads: one OpenMP parallel region per step, torch's thread count (at::get_num_threads, what --threads
// and EngineConfig.num_threads set; the extension shares torch's OpenMP runtime), or one team of our own
// threads in a build without OpenMP (threads.h). Every thread takes its static share of the attention's
// (sequence, KV head) jobs, and of each product's output rows, then what others have not started of theirs
// (Team::each_run); barriers
// sit only where a stage reads what other threads wrote (see Team). The split never changes how a row
// is summed: any thread count gives the same numbers (tests/test_fused_decode.py).
//
// Numerics follow the eager path op for op: every value the eager path rounds to bf16 is rounded to
// bf16 here at the same point (norm outputs, residual adds, RoPE products and sums, the scaled query,
// SiLU and its product, each projection's output, a quantized layer's bias added after rounding), with
// float32 sums inside, so its logits match the eager path's up to summation order.
#pragma once
#include "torch_common.h"
#include "core/attention.h"
#include "core/linear.h"
#include "core/linear_tiles.h"
#include "core/ops.h"
#include "core/rows.h"

using namespace inferlab;
#include <array>
#include <atomic>
#include <thread>
#include <chrono>
#include <map>
#include <string>

namespace {

// One thread's place in the step's one parallel region: its index and the team's size. A step used to
// fork and join torch's threads once per product and once per attention (~180 times a step at 30
// layers); now the team is formed once per step, every thread takes its share of each stage, and the
// stages that read what others wrote wait at a barrier (5 per layer; 6 when rows are chained; 1 before the
// greedy scan of the logits).
// The team's barrier: spin a short while (a stage ends within microseconds of the others on free cores),
// then yield the core between checks. OpenMP's own barrier spins for its whole wait, so when another
// busy process takes one of the cores (a screen recorder, slides), a thread spinning for a descheduled
// partner keeps the partner from running: 2-thread decode collapsed to a fraction of 1-thread speed.
// Yielding after the spin lets the partner run on that core and the step degrades to ~1-thread speed.
struct SpinYieldBarrier {
  std::atomic<int> arrived{0}, phase{0}, size{1};
  void wait() {
    const int ph = phase.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == size.load(std::memory_order_relaxed) - 1) {
      arrived.store(0, std::memory_order_relaxed);
      phase.store(ph + 1, std::memory_order_release);  // releases the others (and this stage's writes)
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; phase.load(std::memory_order_acquire) == ph; ++i) {
      if (i < 64 || (i & 63) != 0 || std::chrono::steady_clock::now() - start < kSpin) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }
  static constexpr std::chrono::microseconds kSpin{50};
};

// One thread's claim on its share of a product's output rows: the next run of 32 it (or another thread)
// takes. Own cache line each: the owner takes from it all along, others only once their own share is done.
struct alignas(64) Cursor {
  std::atomic<int64_t> next{0};
};

struct Team {
  int tid = 0, size = 1;
  SpinYieldBarrier* barrier = nullptr;
  Cursor* cursors = nullptr;  // 2 x size: one set per parity of the product (see each_run)
  void sync() const {
    if (size > 1) barrier->wait();
  }

  // fn(r0, r1) over runs of 32 of n output rows: this thread's share (share()) first, run by run, then the
  // runs the other threads have not started of theirs. A static split alone waits at the next barrier for
  // the slowest thread, and on a shared machine a thread that loses its core for a while holds up the step
  // (2 threads on 2 cores with another process running ran ~1-thread speed). Which thread computes a row
  // never changes its numbers. `stage` (the thread's own count of these calls, the same on every thread)
  // picks the cursor set; the set of the next call is reset by its owner now: every call ends at a
  // barrier, so no thread still takes from it, and none takes from it again before that barrier.
  template <class F>
  void each_run(int64_t n, int64_t& stage, const F& fn) const {
    if (size == 1) return fn(0, n);
    Cursor* set = cursors + (stage & 1) * size;
    cursors[((stage + 1) & 1) * size + tid].next.store(0, std::memory_order_relaxed);
    ++stage;
    const int64_t runs = (n + 31) / 32;
    for (int k = 0; k < size; ++k) {
      const int v = (tid + k) % size;
      const int64_t r0 = runs * v / size, r1 = runs * (v + 1) / size;
      for (int64_t j; (j = r0 + set[v].next.fetch_add(1, std::memory_order_relaxed)) < r1;)
        fn(j * 32, std::min(n, (j + 1) * 32));
    }
  }
  // This thread's share [n0, n1) of n output rows: whole runs of 32 (a cache line of bf16 y is never
  // written by two threads), as even as that allows.
  std::pair<int64_t, int64_t> share(int64_t n) const {
    const int64_t runs = (n + 31) / 32;
    const int64_t r0 = runs * tid / size, r1 = runs * (tid + 1) / size;
    return {std::min(n, r0 * 32), std::min(n, r1 * 32)};
  }
};

// x as a projection's body reads it, prepared once per call and per thread (a few microseconds: each
// thread prepares its own copy rather than wait at one more barrier for a shared one).
struct Prepared {
  const uint16_t* x = nullptr;
  int64_t M = 0;
  const float* xf = nullptr;       // int8, float bodies: x widened; int4 float body: the group sums
  const uint16_t* xperm = nullptr;  // int4 float body: x reordered
  std::array<Q4x, 8> q4{};          // int4 with int8 activations
  std::array<Q8x, 8> q8{};          // int8 with int8 activations
  std::array<Q4t, 8> q4t{};         // int4 tiles with int8 activations
};

inline uint16_t rnd(float v) { return float_to_bf16(v); }
inline float f(uint16_t h) { return bf16_to_float(h); }

// One projection as a layer holds it: bf16 rows (kind 0), int8 rows + one scale each (1), 4-bit
// codes + group (scale, zero) (2), the same in tiles of 16 rows (3, core/linear_tiles.h). The tensors
// are the layer's own (no copy); a bias is kept as float32 for the bf16 kernel (added before rounding,
// as Linear does) and as bf16 for quantized layers (added after rounding, as QuantLinear does).
struct Proj {
  int64_t kind = 0, N = 0, K = 0, group = 0;
  torch::Tensor a, b, bias_f, bias_h;

  Proj(int64_t kind_, torch::Tensor a_, torch::Tensor b_, int64_t group_, c10::optional<torch::Tensor> bias)
      : kind(kind_), group(group_), a(a_.contiguous()), b(b_.defined() ? b_.contiguous() : b_) {
    TORCH_CHECK(kind >= 0 && kind <= 3, "Proj kind: 0 bf16, 1 int8, 2 int4, 3 int4 tiles");
    N = a.size(0);
    if (kind == 0) {
      TORCH_CHECK(a.scalar_type() == at::kBFloat16 && a.dim() == 2, "bf16 weight (N, K)");
      K = a.size(1);
    } else if (kind == 1) {
      TORCH_CHECK(a.scalar_type() == at::kChar && a.dim() == 2 && b.scalar_type() == at::kBFloat16 && b.numel() == N,
                  "int8 rows (N, K) and bf16 scales (N,)");
      K = a.size(1);
    } else {
      K = a.size(1) * 2;
      TORCH_CHECK(a.scalar_type() == at::kByte && b.scalar_type() == at::kBFloat16 && K % 64 == 0 && group >= 32 &&
                      (group & (group - 1)) == 0 && K % group == 0 && b.numel() == N * (K / group) * 2,
                  "int4 codes (N, K / 2), scale_zero (N, K / group, 2); K a multiple of 64 and of the group");
      TORCH_CHECK(kind == 2 || N % kRowTile == 0, "int4 tiles: N a multiple of 16");
    }
    if (bias.has_value() && bias->defined()) {
      TORCH_CHECK(bias->numel() == N, "bias (N,)");
      if (kind == 0) bias_f = bias->to(torch::kFloat32).contiguous();
      else bias_h = bias->to(torch::kBFloat16).contiguous();
    }
  }

  // y (M, N) = x (M, K) W^T in two halves: prepare x (this thread's scratch, big enough for the largest K
  // of the model), then output rows [n0, n1). q8: the 4- and 8-bit products with int8 activations
  // (stream_linear.cpp), else the float bodies.
  void prepare(const uint16_t* x, int64_t M, float* fscratch, uint16_t* hscratch, bool q8, Prepared& p) const {
    p.x = x;
    p.M = M;
    if (kind == 1 && q8) {
      int8_q8_prepare(x, M, K, fscratch, p.q8.data());
    } else if (kind == 2 && q8) {
      int4_q8_prepare(x, M, K, group, fscratch, p.q4.data());
    } else if (kind == 3 && q8) {
      int4t_q8_prepare(x, M, K, group, fscratch, p.q4t.data());
    } else if (kind == 3) {
      int4t_prepare(x, M, K, group, fscratch);
      p.xf = fscratch;
    } else if (kind == 1) {
      int8_prepare(x, M, K, fscratch);
      p.xf = fscratch;
    } else if (kind == 2) {
      int4_prepare(x, M, K, group, fscratch, hscratch);
      p.xf = fscratch;
      p.xperm = hscratch;
    }
  }

  void rows(const Prepared& p, uint16_t* y, int64_t n0, int64_t n1, bool q8) const {
    if (n0 >= n1) return;
    const int64_t M = p.M;
    const uint16_t* sc = kind == 0 ? nullptr : reinterpret_cast<const uint16_t*>(b.data_ptr());
    if (kind == 0) {  // any number of rows: 8 a pass over blocks of W (bf16_rows_any), each row as alone
      bf16_rows_any(p.x, M, reinterpret_cast<const uint16_t*>(a.data_ptr()), y,
                    bias_f.defined() ? bias_f.data_ptr<float>() : nullptr, K, N, n0, n1);
      return;
    }
    if (kind == 1 && q8) int8_q8_range(p.q8.data(), M, a.data_ptr<int8_t>(), sc, nullptr, K, N, y, n0, n1);
    else if (kind == 2 && q8) int4_q8_range(p.q4.data(), M, a.data_ptr<uint8_t>(), sc, group, nullptr, K, N, y, n0, n1);
    else if (kind == 3 && q8) int4t_q8_range(p.q4t.data(), M, a.data_ptr<uint8_t>(), sc, group, nullptr, K, N, y, n0, n1);
    else if (kind == 3) int4t_range(p.xf, M, a.data_ptr<uint8_t>(), sc, group, nullptr, K, N, y, n0, n1);
    else if (kind == 1) int8_range(p.xf, M, a.data_ptr<int8_t>(), sc, nullptr, K, N, y, n0, n1);
    else int4_range(p.x, M, a.data_ptr<uint8_t>(), sc, group, nullptr, K, N, y, p.xf, p.xperm, n0, n1);
    if (bias_h.defined()) {
      const uint16_t* bh = reinterpret_cast<const uint16_t*>(bias_h.data_ptr());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) y[m * N + n] = rnd(f(y[m * N + n]) + f(bh[n]));
    }
  }
};

// y (M, N) = x (M, K) W^T for output rows [n0, n1) and any M: bf16 weights in one call (bf16_rows_any),
// quantized ones 8 rows of x at a time (their preparation's scratch holds 8 rows).
static void product_rows(const Proj& p, const uint16_t* x, int64_t M, uint16_t* y, int64_t n0, int64_t n1,
                         float* fscratch, uint16_t* hscratch, bool q8) {
  const int64_t chunk = p.kind == 0 ? M : kMaxRows;
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    Prepared pr;
    p.prepare(x + m0 * p.K, std::min(chunk, M - m0), fscratch, hscratch, q8, pr);
    p.rows(pr, y + m0 * p.N, n0, n1, q8);
  }
}

// What each thread of the step keeps to itself: its copy of the residual stream and of the normed rows
// (every thread computes them, identically: cheaper than a barrier), and the products' scratch.
struct ThreadScratch {
  std::vector<uint16_t> res, h, hs, hl;  // hl: the rows whose logits are asked for, gathered
  std::vector<float> fs, scores, acc;
  int64_t stage = 0;  // Team::each_run's calls this step
};

struct Layer {
  torch::Tensor in_norm, post_norm, q_norm, k_norm, k_cache, v_cache;
  std::shared_ptr<Proj> qkv, o, gate_up, down;
};

}  // namespace

class FusedModel {
 public:
  FusedModel(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
             torch::Tensor embed, c10::optional<torch::Tensor> embed_scales, torch::Tensor final_norm,
             std::shared_ptr<Proj> head, torch::Tensor cos, torch::Tensor sin)
      : H_(hidden), nh_(heads), nkv_(kv_heads), d_(head_dim), I_(intermediate), eps_(static_cast<float>(eps)),
        embed_(embed.contiguous()), final_norm_(final_norm.contiguous()), head_(std::move(head)),
        cos_(cos.to(torch::kFloat32).contiguous()), sin_(sin.to(torch::kFloat32).contiguous()) {
    TORCH_CHECK(heads % kv_heads == 0 && heads / kv_heads <= 8, "at most 8 query heads per KV head");
    TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim 64 or 128");
    TORCH_CHECK(embed_.dim() == 2 && embed_.size(1) == hidden, "embedding table (vocab, hidden)");
    if (embed_scales.has_value() && embed_scales->defined()) {
      TORCH_CHECK(embed_.scalar_type() == at::kChar && embed_scales->scalar_type() == at::kBFloat16,
                  "an int8 table takes bf16 scales");
      embed_scales_ = embed_scales->contiguous();
    } else {
      TORCH_CHECK(embed_.scalar_type() == at::kBFloat16, "bf16 embedding table");
    }
    TORCH_CHECK(head_->K == hidden, "lm_head in_features == hidden");
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == head_dim && sin_.sizes() == cos_.sizes(), "cos/sin (positions, head_dim)");
  }

  void add_layer(torch::Tensor in_norm, torch::Tensor post_norm, c10::optional<torch::Tensor> q_norm,
                 c10::optional<torch::Tensor> k_norm, std::shared_ptr<Proj> qkv, std::shared_ptr<Proj> o,
                 std::shared_ptr<Proj> gate_up, std::shared_ptr<Proj> down, torch::Tensor k_cache,
                 torch::Tensor v_cache) {
    const int64_t qs = nh_ * d_, kvs = nkv_ * d_;
    TORCH_CHECK(qkv->K == H_ && qkv->N == qs + 2 * kvs, "qkv_proj (q + 2 kv, hidden)");
    TORCH_CHECK(o->K == qs && o->N == H_, "o_proj (hidden, q)");
    TORCH_CHECK(gate_up->K == H_ && gate_up->N == 2 * I_, "gate_up_proj (2 intermediate, hidden)");
    TORCH_CHECK(gate_up->kind != 3 || I_ % kRowTile == 0, "int4 tiles gate_up: intermediate a multiple of 16");
    TORCH_CHECK(down->K == I_ && down->N == H_, "down_proj (hidden, intermediate)");
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 && v_cache.scalar_type() == at::kBFloat16 &&
                    k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 &&
                    k_cache.size(0) == nkv_ && k_cache.size(2) == d_ && v_cache.sizes() == k_cache.sizes(),
                "16-bit KV caches (kv_heads, slots, head_dim), contiguous");
    Layer l;
    l.in_norm = in_norm.to(torch::kBFloat16).contiguous();
    l.post_norm = post_norm.to(torch::kBFloat16).contiguous();
    if (q_norm.has_value() && q_norm->defined()) {
      l.q_norm = q_norm->to(torch::kBFloat16).contiguous();
      l.k_norm = k_norm.value().to(torch::kBFloat16).contiguous();
    }
    l.qkv = std::move(qkv); l.o = std::move(o); l.gate_up = std::move(gate_up); l.down = std::move(down);
    l.k_cache = k_cache; l.v_cache = v_cache;
    max_k_ = std::max({max_k_, H_, I_, nh_ * d_});
    layers_.push_back(std::move(l));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  void set_int8_activations(bool on) { q8_ = on; }
  // Per-op wall time of the steps run while profiling is on (scripts/fused_profile.py): seconds by op.
  void set_profile(bool on) { profile_ = on; prof_.fill(0.0); prof_steps_ = 0; }
  std::map<std::string, double> profile() const {
    std::map<std::string, double> out;
    for (size_t i = 0; i < kOps; ++i) out[kOpNames[i]] = prof_[i];
    out["steps"] = static_cast<double>(prof_steps_);
    return out;
  }
  bool int8_activations() const { return q8_; }

  // ids, positions, slots (n,) int64; blocks (n, max_blocks) int64; ctx_lens (n,) int64 (this token
  // included). Returns (final hidden (n, hidden) bf16, logits (n, vocab) float32, greedy tokens (n,)
  // int64: each row's argmax, -1 where a logit is not finite): the runner's greedy rows need no torch op.
  // `chained`: some rows are consecutive positions of one sequence (a speculative verify of a chain of
  // drafts), so a row attends over K/V that another row of the step writes: every row's K/V is written
  // before any row attends (one more barrier a layer).
  std::vector<torch::Tensor> step(torch::Tensor ids, torch::Tensor positions, torch::Tensor slots,
                                  torch::Tensor blocks, torch::Tensor ctx_lens, int64_t block_size,
                                  bool chained, c10::optional<torch::Tensor> logit_rows) {
    const int64_t n = ids.size(0);
    TORCH_CHECK(n >= 1, "the fused step takes at least one row");
    TORCH_CHECK(!layers_.empty(), "no layers");
    for (auto* t : {&ids, &positions, &slots, &blocks, &ctx_lens})
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "int64 contiguous step inputs");
    TORCH_CHECK(positions.size(0) == n && slots.size(0) == n && ctx_lens.size(0) == n && blocks.dim() == 2 &&
                    blocks.size(0) == n, "one position, slot, block row and length per row");
    const int64_t* idp = ids.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t* lens = ctx_lens.data_ptr<int64_t>();
    const int64_t max_blocks = blocks.size(1), vocab = embed_.size(0), total_slots = layers_[0].k_cache.size(1);
    for (int64_t r = 0; r < n; ++r) {  // bad input fails alone, before anything is written
      TORCH_CHECK(idp[r] >= 0 && idp[r] < vocab, "token id out of range");
      TORCH_CHECK(pos[r] >= 0 && pos[r] < cos_.size(0), "position beyond the rotary table");
      TORCH_CHECK(slot[r] >= 0 && slot[r] < total_slots, "KV slot out of range");
      TORCH_CHECK(lens[r] >= 1 && lens[r] <= max_blocks * block_size, "context length beyond the block table");
    }
    const int64_t* bt = blocks.data_ptr<int64_t>();
    for (int64_t i = 0; i < n * max_blocks; ++i)
      TORCH_CHECK(bt[i] >= 0 && bt[i] * block_size < total_slots, "block id out of range");
    logit_rows_.clear();  // the rows whose logits are asked for (a prompt chunk's last row only), in order
    if (logit_rows.has_value() && logit_rows->defined()) {
      TORCH_CHECK(logit_rows->scalar_type() == at::kLong && logit_rows->dim() == 1 && logit_rows->is_contiguous(),
                  "logit_rows: int64 (rows,)");
      const int64_t* lr = logit_rows->data_ptr<int64_t>();
      for (int64_t i = 0; i < logit_rows->size(0); ++i) {
        TORCH_CHECK(lr[i] >= 0 && lr[i] < n, "logit row out of range");
        logit_rows_.push_back(lr[i]);
      }
    } else {
      for (int64_t r = 0; r < n; ++r) logit_rows_.push_back(r);
    }
    const int64_t nl = static_cast<int64_t>(logit_rows_.size());

    const int64_t V = head_->N;
    auto hidden = torch::empty({n, H_}, torch::dtype(torch::kBFloat16));
    auto logits = torch::empty({nl, V}, torch::dtype(torch::kFloat32));
    logits_h_.resize(std::max<int64_t>(1, nl) * V);
    const std::vector<int64_t> cost = job_costs(lens, n, nkv_);  // the attention's jobs, balanced by context
    int64_t max_len = 0;
    for (int64_t r = 0; r < n; ++r) max_len = std::max(max_len, lens[r]);
    const int threads = std::max(1, at::get_num_threads());
    ensure_scratch(threads, (max_len + 15) / 16 * 16, n, nl);  // nothing is allocated inside the region
    for (int i = 0; i < 2 * threads; ++i) cursors_[i].next.store(0, std::memory_order_relaxed);
    for (ThreadScratch& ts : scratch_) ts.stage = 0;
    StepArgs a{n, idp, pos, slot, bt, lens, max_blocks, block_size, total_slots,
               reinterpret_cast<uint16_t*>(hidden.data_ptr()), logits.data_ptr<float>(), &cost, chained};
    if (profile_) ++prof_steps_;
    for (Greedy& g : greedy_) g = Greedy{};  // a thread the runtime did not start leaves its share empty
    inferlab::run_team(threads, [&](int tid, int size) {  // the team may be smaller than asked (OpenMP)
      barrier_.size.store(size, std::memory_order_relaxed);  // the same value from every thread, before any wait
      run_team(Team{tid, size, &barrier_, cursors_.get()}, a);
    });
    return {hidden, logits, greedy_tokens(nl, threads)};
  }

 private:
  // One step's inputs and outputs, as the team reads them.
  struct StepArgs {
    int64_t n;
    const int64_t *ids, *pos, *slot, *bt, *lens;
    int64_t max_blocks, block_size, total_slots;
    uint16_t* hidden;
    float* logits;
    const std::vector<int64_t>* cost;
    bool chained;  // rows of one sequence at consecutive positions (see step)
  };

  // The whole step on one thread of the team (all of them run it; see Team).
  void run_team(const Team& t, const StepArgs& a) {
    const int64_t n = a.n;
    ThreadScratch& s = scratch_[t.tid];
    uint16_t *res = s.res.data(), *h = s.h.data();
    auto time = Clock::now();
    for (int64_t r = 0; r < n; ++r) {  // the embedding rows are the first residual
      if (embed_scales_.defined()) {
        const int8_t* q = embed_.data_ptr<int8_t>() + a.ids[r] * H_;
        const float sc = f(reinterpret_cast<const uint16_t*>(embed_scales_.data_ptr())[a.ids[r]]);
        for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(static_cast<float>(q[i]) * sc);
      } else {
        std::memcpy(res + r * H_, reinterpret_cast<const uint16_t*>(embed_.data_ptr()) + a.ids[r] * H_, H_ * 2);
      }
    }
    tick(t, kEmbed, time);
    uint16_t *out = out_.data(), *gu = gu_.data(), *act = act_.data();
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      add_and_norm(res, li > 0 ? out : nullptr, L.in_norm, n, h);  // residual += the previous MLP output
      tick(t, kNorms, time);
      product(*L.qkv, h, n, qkv_.data(), s, t);
      t.sync();
      tick(t, kQkv, time);
      attention(L, a, s, t);
      t.sync();
      tick(t, kAttention, time);
      product(*L.o, att_.data(), n, out, s, t);
      t.sync();
      tick(t, kOproj, time);
      add_and_norm(res, out, L.post_norm, n, h);
      tick(t, kNorms, time);
      gate_up_silu(*L.gate_up, h, n, gu, act, s, t);
      t.sync();
      tick(t, kGateUp, time);
      product(*L.down, act, n, out, s, t);
      t.sync();
      tick(t, kDown, time);
    }
    add_and_norm(res, out, final_norm_, n, h);
    if (t.tid == 0) std::memcpy(a.hidden, h, n * H_ * 2);
    tick(t, kFinalNorm, time);
    const int64_t V = head_->N, nl = static_cast<int64_t>(logit_rows_.size());
    uint16_t* lh = logits_h_.data();
    if (nl < n) {  // only the rows asked for: each thread gathers them into its own copy
      uint16_t* hl = s.hl.data();
      for (int64_t i = 0; i < nl; ++i) std::memcpy(hl + i * H_, h + logit_rows_[i] * H_, H_ * 2);
      h = hl;
    }
    if (nl > 0) product(*head_, h, nl, lh, s, t);
    t.sync();  // runs of logits may come from any thread (each_run); each thread then scans its share
    const auto [v0, v1] = t.share(V);
    for (int64_t r = 0; r < nl; ++r) {  // float32 logits, and this share's greedy token and finiteness
      Greedy& g = greedy_[t.tid * nl + r];
      g = Greedy{};
      float* row = a.logits + r * V;
      for (int64_t i = v0; i < v1; ++i) row[i] = f(lh[r * V + i]);
      if (v1 == v0) continue;  // an empty share: nothing to scan
      const int64_t k = greedy_token(row + v0, v1 - v0);  // the sampler's scan (core/rows.h), -1: not finite
      if (k < 0) g.finite = false;
      else g.value = row[v0 + k], g.index = v0 + k;  // the first of equal maxima
    }
    tick(t, kHead, time);
  }

  // Per row and thread: the largest finite logit of the thread's share, its index, and whether every
  // logit there was finite.
  struct Greedy {
    float value = 0.f;
    int64_t index = -1;
    bool finite = true;
  };

  // Each row's greedy token (the first index of the largest logit, as torch.argmax) or -1 where a
  // logit is NaN or infinite (that row fails, as the sampler fails it), from the threads' shares.
  torch::Tensor greedy_tokens(int64_t n, int threads) const {
    auto out = torch::empty({n}, torch::dtype(torch::kInt64));
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
      Greedy best;
      for (int th = 0; th < threads; ++th) {  // shares in index order: a tie keeps the earlier one
        const Greedy& g = greedy_[th * n + r];
        best.finite = best.finite && g.finite;
        if (g.index >= 0 && (best.index < 0 || g.value > best.value)) best.value = g.value, best.index = g.index;
      }
      o[r] = best.finite ? best.index : -1;
    }
    return out;
  }

  // For each row: res += add (when given), then RMSNorm(res) into h. Every thread does it on its own copy.
  void add_and_norm(uint16_t* res, const uint16_t* add, const torch::Tensor& w, int64_t n, uint16_t* h) const {
    const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
    for (int64_t r = 0; r < n; ++r) {
      if (add != nullptr)
        for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(f(res[r * H_ + i]) + f(add[r * H_ + i]));
      rms_norm(res + r * H_, wp, H_, eps_, h + r * H_);
    }
  }

  // y (n, N) = x P^T: x prepared by this thread, this thread's share of the output rows.
  // With more rows than one preparation holds (quantized, past 8 rows), the static share: x is prepared once
  // per chunk of rows, which a run taken by another thread would repeat.
  void product(const Proj& p, const uint16_t* x, int64_t n, uint16_t* y, ThreadScratch& s, const Team& t) const {
    if (p.kind != 0 && n > kMaxRows) {
      const auto [n0, n1] = t.share(p.N);
      return product_rows(p, x, n, y, n0, n1, s.fs.data(), s.hs.data(), q8_);
    }
    Prepared pr;
    p.prepare(x, n, s.fs.data(), s.hs.data(), q8_, pr);
    t.each_run(p.N, s.stage, [&](int64_t r0, int64_t r1) { p.rows(pr, y, r0, r1, q8_); });
  }

  // gate_up and SiLU(gate) * up: this thread's share [i0, i1) of the intermediate columns, both halves of
  // gate_up for them, so the product needs no barrier before the activation.
  void gate_up_silu(const Proj& p, const uint16_t* x, int64_t n, uint16_t* gu, uint16_t* act, ThreadScratch& s,
                    const Team& t) const {
    auto both = [&](const Prepared& pr, int64_t m0, int64_t i0, int64_t i1) {
      p.rows(pr, gu + m0 * p.N, i0, i1, q8_);
      p.rows(pr, gu + m0 * p.N, I_ + i0, I_ + i1, q8_);
    };
    if (p.kind == 0 || n <= kMaxRows) {  // runs of columns as product's, SiLU on each run as it is done
      Prepared pr;
      p.prepare(x, n, s.fs.data(), s.hs.data(), q8_, pr);
      t.each_run(I_, s.stage, [&](int64_t i0, int64_t i1) {
        both(pr, 0, i0, i1);
        for (int64_t r = 0; r < n; ++r) silu_mul(gu + r * 2 * I_, gu + r * 2 * I_ + I_, act + r * I_, i0, i1);
      });
      return;
    }
    const auto [i0, i1] = t.share(I_);
    const int64_t chunk = kMaxRows;  // as product_rows: both halves per chunk of rows
    for (int64_t m0 = 0; m0 < n; m0 += chunk) {
      Prepared pr;
      p.prepare(x + m0 * p.K, std::min(chunk, n - m0), s.fs.data(), s.hs.data(), q8_, pr);
      both(pr, m0, i0, i1);
    }
    for (int64_t r = 0; r < n; ++r) silu_mul(gu + r * 2 * I_, gu + r * 2 * I_ + I_, act + r * I_, i0, i1);
  }

  // This thread's (sequence, KV head) jobs: q/k norm, RoPE and the query scale for the job's heads, its
  // K and V rows written into the paged caches, then its attention. A job reads only the cache rows of
  // its own sequence and KV head, so no other thread waits on its write; except chained rows (a verify
  // run's drafts, one sequence), which read each other's: there all writes end at a barrier first.
  void attention(const Layer& L, const StepArgs& a, ThreadScratch& s, const Team& t) {
    const int64_t qs = nh_ * d_, kvs = nkv_ * d_, qkvn = qs + 2 * kvs, group = nh_ / nkv_, slots = a.total_slots;
    const float scale = 1.f / std::sqrt(static_cast<float>(d_));
    uint16_t* kc = reinterpret_cast<uint16_t*>(L.k_cache.data_ptr());
    uint16_t* vc = reinterpret_cast<uint16_t*>(L.v_cache.data_ptr());
    const uint16_t* qw = L.q_norm.defined() ? reinterpret_cast<const uint16_t*>(L.q_norm.data_ptr()) : nullptr;
    const uint16_t* kw = L.q_norm.defined() ? reinterpret_cast<const uint16_t*>(L.k_norm.data_ptr()) : nullptr;
    const auto [j0, j1] = job_share(*a.cost, t.tid, t.size);
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t r = job / nkv_, kh = job % nkv_;
      uint16_t* q = qkv_.data() + r * qkvn + kh * group * d_;
      uint16_t* k = qkv_.data() + r * qkvn + qs + kh * d_;
      const uint16_t* v = k + kvs;
      uint16_t* qd = qd_.data() + r * qs + kh * group * d_;
      const float* c = cos_.data_ptr<float>() + a.pos[r] * d_;
      const float* sn = sin_.data_ptr<float>() + a.pos[r] * d_;
      for (int64_t g = 0; g < group; ++g) {
        uint16_t* qh = q + g * d_;
        if (qw != nullptr) rms_norm(qh, qw, d_, eps_, qh);
        rope(qh, c, sn, d_);
        for (int64_t i = 0; i < d_; ++i) qd[g * d_ + i] = rnd(f(qh[i]) * scale);
      }
      if (kw != nullptr) rms_norm(k, kw, d_, eps_, k);
      rope(k, c, sn, d_);
      std::memcpy(kc + (kh * slots + a.slot[r]) * d_, k, d_ * 2);
      std::memcpy(vc + (kh * slots + a.slot[r]) * d_, v, d_ * 2);
      if (!a.chained) attend_job(job, kc, vc, slots, a, s);
    }
    if (!a.chained) return;
    t.sync();  // chained rows: every row's K/V is in the cache before any row reads it
    for (int64_t job = j0; job < j1; ++job) attend_job(job, kc, vc, slots, a, s);
  }

  void attend_job(int64_t job, const uint16_t* kc, const uint16_t* vc, int64_t slots, const StepArgs& a,
                  ThreadScratch& s) {
    const int64_t r = job / nkv_, kh = job % nkv_, group = nh_ / nkv_;
    attend(qd_.data() + r * nh_ * d_ + kh * group * d_, kc + kh * slots * d_, vc + kh * slots * d_,
           a.bt + r * a.max_blocks, a.lens[r], a.block_size, group, d_, s.scores, s.acc,
           att_.data() + job * group * d_);
  }

  enum Op { kEmbed, kNorms, kQkv, kAttention, kOproj, kGateUp, kDown, kFinalNorm, kHead, kOps };
  static constexpr const char* kOpNames[kOps] = {"embed", "norms_and_adds", "qkv_proj",
                                                 "attention_with_qk_norm_rope_kv_write", "o_proj",
                                                 "gate_up_proj_silu_mul", "down_proj", "final_norm", "lm_head"};
  using Clock = std::chrono::steady_clock;
  // Adds the time since `t` to op `o` and restarts `t` (only while profiling; thread 0's clock: a stage
  // that ends at a barrier counts the slowest thread).
  void tick(const Team& team, Op o, Clock::time_point& t) {
    if (!profile_ || team.tid != 0) return;
    const auto now = Clock::now();
    prof_[o] += std::chrono::duration<double>(now - t).count();
    t = now;
  }
  bool profile_ = false;
  std::array<double, kOps> prof_{};
  int64_t prof_steps_ = 0;

  // The shared buffers, and each thread's own for `threads` threads and contexts up to max_len.
  // The shared buffers for n rows, each thread's own for `threads` threads, n rows, nl rows of logits and
  // contexts up to max_len (grown, never shrunk: a long prompt's chunk sizes them once).
  void ensure_scratch(int threads, int64_t max_len, int64_t n, int64_t nl) {
    const int64_t R = 8, qs = nh_ * d_, kvs = nkv_ * d_, group = nh_ / nkv_;
    const int64_t kmax = std::max(max_k_, H_), rows = std::max(R, n);
    if (rows > rows_) {
      rows_ = rows;
      out_.resize(rows * H_);
      qkv_.resize(rows * (qs + 2 * kvs)); qd_.resize(rows * qs); att_.resize(rows * qs);
      gu_.resize(rows * 2 * I_); act_.resize(rows * I_);
    }
    if (static_cast<int>(scratch_.size()) < threads) scratch_.resize(threads);
    if (cursor_threads_ < threads) cursors_.reset(new Cursor[2 * threads]), cursor_threads_ = threads;
    if (static_cast<int64_t>(greedy_.size()) < threads * std::max<int64_t>(nl, 8)) greedy_.resize(threads * std::max<int64_t>(nl, 8));
    for (ThreadScratch& s : scratch_) {
      if (s.fs.empty()) {
        // int8 / int4: x in float32 or quantized to int8 with its scales (whichever needs more), 8 rows a pass
        s.fs.resize(std::max({R * kmax, q4_scratch_floats(R, kmax), q8_scratch_floats(R, kmax),
                              q4t_scratch_floats(R, kmax), f4t_scratch_floats(R, kmax)}) + 64);
        s.hs.resize(R * kmax + 64);  // int4: x reordered
        s.acc.resize(8 * 128);       // the portable attention body's sums (group <= 8, head_dim <= 128)
      }
      if (static_cast<int64_t>(s.res.size()) < rows * H_) s.res.resize(rows * H_), s.h.resize(rows * H_);
      if (static_cast<int64_t>(s.hl.size()) < nl * H_) s.hl.resize(nl * H_);
      if (static_cast<int64_t>(s.scores.size()) < group * max_len) s.scores.resize(group * max_len);
    }
  }

  int64_t H_, nh_, nkv_, d_, I_, max_k_ = 0, rows_ = 0;  // rows_: rows the shared buffers hold
  bool q8_ = false;
  float eps_;
  torch::Tensor embed_, embed_scales_, final_norm_;
  std::shared_ptr<Proj> head_;
  torch::Tensor cos_, sin_;
  std::vector<Layer> layers_;
  std::vector<uint16_t> out_, qkv_, qd_, att_, gu_, act_, logits_h_;  // shared by the team
  std::vector<int64_t> logit_rows_;  // this step's rows whose logits are asked for
  std::vector<ThreadScratch> scratch_;  // one per thread
  std::vector<Greedy> greedy_;          // (thread, row)
  SpinYieldBarrier barrier_;            // the team's (see Team)
  std::unique_ptr<Cursor[]> cursors_;   // Team::each_run's, 2 per thread
  int cursor_threads_ = 0;
};
