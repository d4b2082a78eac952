// One native call per decode step: the whole transformer for 1..8 decode rows on the CPU, bf16
// activations, a 16-bit paged KV cache (EngineConfig.fused_decode; engine/runner/fused.py builds it).
//
// The eager path runs ~360 small torch ops per step (norms, RoPE, KV writes, casts, splits) between
// the Linear layers; each costs microseconds of dispatch, which at one stream is as long as reading
// the weights. Here every small op is a raw-pointer loop over preallocated scratch, and the matrix-
// vector products and the attention are the same bodies the separate kernels run: this file is one
// translation unit with stream_linear.cpp and paged_decode.cpp (included below), so nothing is copied.
//
// Numerics follow the eager path op for op: every value the eager path rounds to bf16 is rounded to
// bf16 here at the same point (norm outputs, residual adds, RoPE products and sums, the scaled query,
// SiLU and its product, each projection's output, a quantized layer's bias added after rounding), with
// float32 sums inside, so its logits match the eager path's up to summation order.
#define INFERLAB_NO_MODULE
#include "stream_linear.cpp"
#include "paged_decode.cpp"
#undef INFERLAB_NO_MODULE
#include <array>
#include <chrono>
#include <map>
#include <string>

namespace {

inline uint16_t rnd(float v) { return float_to_bf16(v); }
inline float f(uint16_t h) { return bf16_to_float(h); }

// One projection as a layer holds it: bf16 rows (kind 0), int8 rows + one scale each (1), 4-bit
// codes + group (scale, zero) (2). The tensors are the layer's own (no copy); a bias is kept as
// float32 for the bf16 kernel (added before rounding, as Linear does) and as bf16 for quantized
// layers (added after rounding, as QuantLinear does).
struct Proj {
  int64_t kind = 0, N = 0, K = 0, group = 0;
  torch::Tensor a, b, bias_f, bias_h;

  Proj(int64_t kind_, torch::Tensor a_, torch::Tensor b_, int64_t group_, c10::optional<torch::Tensor> bias)
      : kind(kind_), group(group_), a(a_.contiguous()), b(b_.defined() ? b_.contiguous() : b_) {
    TORCH_CHECK(kind >= 0 && kind <= 2, "Proj kind: 0 bf16, 1 int8, 2 int4");
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
    }
    if (bias.has_value() && bias->defined()) {
      TORCH_CHECK(bias->numel() == N, "bias (N,)");
      if (kind == 0) bias_f = bias->to(torch::kFloat32).contiguous();
      else bias_h = bias->to(torch::kBFloat16).contiguous();
    }
  }

  // y (M, N) = x (M, K) W^T; scratch big enough for the largest K of the model. q8: the 4- and 8-bit
  // products with int8 activations (stream_linear.cpp), else the float bodies.
  void run(const uint16_t* x, int64_t M, uint16_t* y, float* fscratch, uint16_t* hscratch, bool q8) const {
    if (kind == 0) {
      linear_bf16(x, M, reinterpret_cast<const uint16_t*>(a.data_ptr()),
                  bias_f.defined() ? bias_f.data_ptr<float>() : nullptr, K, N, y);
      return;
    }
    if (kind == 1 && q8)
      linear_int8_q8(x, M, a.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(b.data_ptr()), nullptr, K, N, y,
                     fscratch);
    else if (kind == 2 && q8)
      linear_int4_q8(x, M, a.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(b.data_ptr()), group, nullptr, K,
                     N, y, fscratch);
    else if (kind == 1)
      linear_int8(x, M, a.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(b.data_ptr()), nullptr, K, N, y,
                  fscratch);
    else
      linear_int4(x, M, a.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(b.data_ptr()), group, nullptr, K, N,
                  y, fscratch, hscratch);
    if (bias_h.defined()) {
      const uint16_t* bh = reinterpret_cast<const uint16_t*>(bias_h.data_ptr());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) y[m * N + n] = rnd(f(y[m * N + n]) + f(bh[n]));
    }
  }
};

struct Layer {
  torch::Tensor in_norm, post_norm, q_norm, k_norm, k_cache, v_cache;
  std::shared_ptr<Proj> qkv, o, gate_up, down;
};

// RMSNorm as engine/models/layers/norm.py: float32 statistics, normalised value rounded to bf16, then
// times the bf16 weight (rounded again).
inline void rms_norm(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* y) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) { const float v = f(x[i]); ss += v * v; }
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = rnd(f(w[i]) * f(rnd(f(x[i]) * r)));
}

// Rotate-half RoPE on one head in place, as engine/models/layers/rotary.py in bf16: cos and sin rounded
// to bf16, x*cos and rotated*sin each rounded, then their sum.
inline void rope(uint16_t* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  alignas(64) uint16_t out[256];
  for (int64_t j = 0; j < d; ++j) {
    const float rot = j < half ? -f(x[j + half]) : f(x[j - half]);
    const float a = f(rnd(f(x[j]) * f(rnd(cos[j])))), b = f(rnd(rot * f(rnd(sin[j]))));
    out[j] = rnd(a + b);
  }
  std::memcpy(x, out, d * sizeof(uint16_t));
}

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

#ifdef INFERLAB_AVX512_BF16
inline __m512 bf16x16_to_float_reg(__m256bh h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}
#endif

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
  // included). Returns (final hidden (n, hidden) bf16, logits (n, vocab) float32).
  std::vector<torch::Tensor> step(torch::Tensor ids, torch::Tensor positions, torch::Tensor slots,
                                  torch::Tensor blocks, torch::Tensor ctx_lens, int64_t block_size) {
    const int64_t n = ids.size(0);
    TORCH_CHECK(n >= 1 && n <= 8, "the fused decode step takes 1 to 8 rows");
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

    const int64_t qs = nh_ * d_, kvs = nkv_ * d_, qkvn = qs + 2 * kvs, group = nh_ / nkv_;
    ensure_scratch();
    uint16_t *res = res_.data(), *h = h_.data(), *qkv = qkv_.data(), *qd = qd_.data(), *att = att_.data(),
             *gu = gu_.data(), *act = act_.data(), *out = out_.data();
    float* fs = fscratch_.data();
    uint16_t* hs = hscratch_.data();
    const float scale = 1.f / std::sqrt(static_cast<float>(d_));
    const float* cosp = cos_.data_ptr<float>();
    const float* sinp = sin_.data_ptr<float>();

    if (profile_) ++prof_steps_;
    auto t = Clock::now();
    for (int64_t r = 0; r < n; ++r) {  // the embedding rows are the first residual
      if (embed_scales_.defined()) {
        const int8_t* q = embed_.data_ptr<int8_t>() + idp[r] * H_;
        const float s = f(reinterpret_cast<const uint16_t*>(embed_scales_.data_ptr())[idp[r]]);
        for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(static_cast<float>(q[i]) * s);
      } else {
        std::memcpy(res + r * H_, reinterpret_cast<const uint16_t*>(embed_.data_ptr()) + idp[r] * H_, H_ * 2);
      }
    }
    tick(kEmbed, t);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      const uint16_t* w_in = reinterpret_cast<const uint16_t*>(L.in_norm.data_ptr());
      for (int64_t r = 0; r < n; ++r) {
        if (li > 0)  // residual += the previous layer's MLP output
          for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(f(res[r * H_ + i]) + f(out[r * H_ + i]));
        rms_norm(res + r * H_, w_in, H_, eps_, h + r * H_);
      }
      tick(kNorms, t);
      L.qkv->run(h, n, qkv, fs, hs, q8_);
      tick(kQkv, t);
      uint16_t* kc = reinterpret_cast<uint16_t*>(L.k_cache.data_ptr());
      uint16_t* vc = reinterpret_cast<uint16_t*>(L.v_cache.data_ptr());
      for (int64_t r = 0; r < n; ++r) {
        uint16_t* q = qkv + r * qkvn;
        uint16_t* k = q + qs;
        const uint16_t* v = k + kvs;
        if (L.q_norm.defined()) {
          const uint16_t* qw = reinterpret_cast<const uint16_t*>(L.q_norm.data_ptr());
          const uint16_t* kw = reinterpret_cast<const uint16_t*>(L.k_norm.data_ptr());
          for (int64_t hh = 0; hh < nh_; ++hh) rms_norm(q + hh * d_, qw, d_, eps_, q + hh * d_);
          for (int64_t hh = 0; hh < nkv_; ++hh) rms_norm(k + hh * d_, kw, d_, eps_, k + hh * d_);
        }
        const float* c = cosp + pos[r] * d_;
        const float* s = sinp + pos[r] * d_;
        for (int64_t hh = 0; hh < nh_; ++hh) rope(q + hh * d_, c, s, d_);
        for (int64_t hh = 0; hh < nkv_; ++hh) rope(k + hh * d_, c, s, d_);
        for (int64_t i = 0; i < qs; ++i) qd[r * qs + i] = rnd(f(q[i]) * scale);
        tick(kQkNormRope, t);
        for (int64_t hh = 0; hh < nkv_; ++hh) {
          std::memcpy(kc + (hh * total_slots + slot[r]) * d_, k + hh * d_, d_ * 2);
          std::memcpy(vc + (hh * total_slots + slot[r]) * d_, v + hh * d_, d_ * 2);
        }
        tick(kKvWrite, t);
      }
      paged_decode_raw(qd, kc, vc, bt, lens, n, nkv_, group, d_, total_slots, max_blocks, block_size, att);
      tick(kAttention, t);
      L.o->run(att, n, out, fs, hs, q8_);
      tick(kOproj, t);
      const uint16_t* w_post = reinterpret_cast<const uint16_t*>(L.post_norm.data_ptr());
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(f(res[r * H_ + i]) + f(out[r * H_ + i]));
        rms_norm(res + r * H_, w_post, H_, eps_, h + r * H_);
      }
      tick(kNorms, t);
      L.gate_up->run(h, n, gu, fs, hs, q8_);
      tick(kGateUp, t);
      for (int64_t r = 0; r < n; ++r) {
        const uint16_t* g = gu + r * 2 * I_;
        int64_t i = 0;
#ifdef INFERLAB_AVX512_BF16
        for (; i + 16 <= I_; i += 16) {  // the same two roundings, 16 lanes at a time
          const __m512 gv = bf16x16_to_float(g + i);
          const __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
          const __m512 sr = bf16x16_to_float_reg(_mm512_cvtneps_pbh(sv));
          const __m512 pv = _mm512_mul_ps(sr, bf16x16_to_float(g + I_ + i));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(act + r * I_ + i), (__m256i)_mm512_cvtneps_pbh(pv));
        }
#endif
        for (; i < I_; ++i) act[r * I_ + i] = rnd(f(rnd(silu(f(g[i])))) * f(g[I_ + i]));
      }
      tick(kSilu, t);
      L.down->run(act, n, out, fs, hs, q8_);
      tick(kDown, t);
    }
    auto hidden = torch::empty({n, H_}, torch::dtype(torch::kBFloat16));
    uint16_t* hid = reinterpret_cast<uint16_t*>(hidden.data_ptr());
    const uint16_t* w_final = reinterpret_cast<const uint16_t*>(final_norm_.data_ptr());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < H_; ++i) res[r * H_ + i] = rnd(f(res[r * H_ + i]) + f(out[r * H_ + i]));
      rms_norm(res + r * H_, w_final, H_, eps_, hid + r * H_);
    }
    tick(kFinalNorm, t);
    const int64_t V = head_->N;
    logits_h_.resize(n * V);
    head_->run(hid, n, logits_h_.data(), fs, hs, q8_);
    auto logits = torch::empty({n, V}, torch::dtype(torch::kFloat32));
    float* lp = logits.data_ptr<float>();
    for (int64_t i = 0; i < n * V; ++i) lp[i] = f(logits_h_[i]);
    tick(kHead, t);
    return {hidden, logits};
  }

 private:
  enum Op { kEmbed, kNorms, kQkv, kQkNormRope, kKvWrite, kAttention, kOproj, kGateUp, kSilu, kDown, kFinalNorm,
            kHead, kOps };
  static constexpr const char* kOpNames[kOps] = {"embed", "norms_and_adds", "qkv_proj", "qk_norm_rope_scale",
                                                 "kv_write", "attention", "o_proj", "gate_up_proj", "silu_mul",
                                                 "down_proj", "final_norm", "lm_head"};
  using Clock = std::chrono::steady_clock;
  // Adds the time since `t` to op `o` and restarts `t` (only while profiling).
  void tick(Op o, Clock::time_point& t) {
    if (!profile_) return;
    const auto now = Clock::now();
    prof_[o] += std::chrono::duration<double>(now - t).count();
    t = now;
  }
  bool profile_ = false;
  std::array<double, kOps> prof_{};
  int64_t prof_steps_ = 0;

  void ensure_scratch() {
    if (!res_.empty()) return;
    const int64_t R = 8, qs = nh_ * d_, kvs = nkv_ * d_;
    const int64_t kmax = std::max(max_k_, H_);
    res_.resize(R * H_); h_.resize(R * H_); out_.resize(R * H_);
    qkv_.resize(R * (qs + 2 * kvs)); qd_.resize(R * qs); att_.resize(R * qs);
    gu_.resize(R * 2 * I_); act_.resize(R * I_);
    // int8 / int4: x in float32 or quantized to int8 with its scales (whichever needs more)
    fscratch_.resize(std::max({R * kmax, q4_scratch_floats(R, kmax), q8_scratch_floats(R, kmax)}) + 64);
    hscratch_.resize(R * kmax + 64);  // int4: x reordered
  }

  int64_t H_, nh_, nkv_, d_, I_, max_k_ = 0;
  bool q8_ = false;
  float eps_;
  torch::Tensor embed_, embed_scales_, final_norm_;
  std::shared_ptr<Proj> head_;
  torch::Tensor cos_, sin_;
  std::vector<Layer> layers_;
  std::vector<uint16_t> res_, h_, out_, qkv_, qd_, att_, gu_, act_, hscratch_, logits_h_;
  std::vector<float> fscratch_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  // module_local: the portable and the native build load side by side in one process (the tests)
  py::class_<Proj, std::shared_ptr<Proj>>(m, "Proj", py::module_local())
      .def(py::init<int64_t, torch::Tensor, torch::Tensor, int64_t, c10::optional<torch::Tensor>>(),
           py::arg("kind"), py::arg("a"), py::arg("b"), py::arg("group"), py::arg("bias"))
      .def_readonly("kind", &Proj::kind)
      .def_readonly("N", &Proj::N)
      .def_readonly("K", &Proj::K);
  py::class_<FusedModel>(m, "FusedModel", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, torch::Tensor, c10::optional<torch::Tensor>,
                    torch::Tensor, std::shared_ptr<Proj>, torch::Tensor, torch::Tensor>())
      .def("add_layer", &FusedModel::add_layer)
      .def("num_layers", &FusedModel::num_layers)
      .def("set_int8_activations", &FusedModel::set_int8_activations)
      .def("set_profile", &FusedModel::set_profile)
      .def("profile", &FusedModel::profile)
      .def("int8_activations", &FusedModel::int8_activations)
      // Without the GIL while it runs (as torch's own ops): the app's GUI thread keeps running meanwhile.
      .def("step", &FusedModel::step, py::call_guard<py::gil_scoped_release>());
  m.def("has_avx512_bf16", &has_avx512_bf16, "whether this build runs the AVX-512 bf16 bodies");
}
