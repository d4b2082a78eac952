// The native CPU kernels' one translation unit, built once per ISA tier (engine/kernels/build.py passes
// the tier's compiler flags; core/isa.h turns them into one body per kernel): the weight-streaming
// products (stream_linear.cpp), the paged decode attention (paged_decode.cpp) and the fused decode step
// (fused_decode.cpp) in one module, so each tier is one build.
#include "stream_linear.cpp"
#include "paged_decode.cpp"
#include "fused_decode.cpp"
#include "sample_rows.cpp"

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
      .def("step", &FusedModel::step, py::arg("ids"), py::arg("positions"), py::arg("slots"), py::arg("blocks"),
           py::arg("ctx_lens"), py::arg("block_size"), py::arg("chained") = false, py::arg("logit_rows") = py::none(),
           py::call_guard<py::gil_scoped_release>());
  // The weight-streaming products and the paged attention as torch ops (without the GIL while they run).
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("stream_linear_bf16", &stream_linear_bf16, "x W^T for any rows (8 a pass over a block of W), W bf16 (N, K)", nogil);
  m.def("stream_linear_int4", &stream_linear_int4, "x W^T with W as 4-bit codes + group (scale, zero)", nogil);
  m.def("stream_linear_int8", &stream_linear_int8, "x W^T for 1-8 rows, W as int8 rows with one scale each", nogil);
  m.def("stream_linear_int4_q8", &stream_linear_int4_q8, "the int4 product with int8 activations (per 32 columns)",
        nogil);
  m.def("stream_linear_int8_q8", &stream_linear_int8_q8, "the int8 product with int8 activations (per 32 columns)",
        nogil);
  m.def("stream_linear_int4_tiles", &stream_linear_int4_tiles,
        "x W^T with W as 4-bit codes + group (scale, zero) in tiles of 16 rows (core/linear_tiles.h)", nogil);
  m.def("stream_linear_int4_tiles_q8", &stream_linear_int4_tiles_q8,
        "the int4 tiles product with int8 activations (per 32 columns)", nogil);
  m.def("dequant_int4_tiles", &dequant_int4_tiles, "int4 tiles -> W (N, K) bf16 into out, as the reference", nogil);
  m.def("dequant_int4", &dequant_int4, "int4 chunks -> W (N, K) bf16 into out, as the reference", nogil);
  m.def("dequant_int8", &dequant_int8, "int8 rows -> W (N, K) bf16 into out, as the reference", nogil);
  m.def("pack_int4", &pack_int4, "4-bit codes (N, K) -> the kernel's chunk layout (N, K / 2)");
  m.def("greedy_rows", &greedy_rows, "each row's first largest logit, -1 where a logit is not finite", nogil);
  m.def("sample_rows", &sample_rows, "each row's greedy token (temperature 0) or one drawn at its temperature with "
        "its uniform number u, -1 where a logit is not finite", nogil);
  m.def("paged_decode", &paged_decode, "decode attention over the paged KV cache (bf16)", nogil);
  m.def("tier", &inferlab::tier_name, "the ISA tier this build runs: portable, avx2, avx512 or neon");
  m.def("set_bf16_body", [](const std::string& body) {
        TORCH_CHECK(body == "tiles" || body == "rows" || body == "stream", "bf16 body: tiles, rows or stream");
        inferlab::g_bf16_body.store(body == "rows"     ? inferlab::kBf16Rows
                                    : body == "stream" ? inferlab::kBf16Stream
                                                       : inferlab::kBf16Tiles);
      }, "how the bf16 bodies walk W for up to 8 rows (core/linear.h): tiles, rows or stream; the same numbers "
         "whichever");
  m.def("bf16_body", [] {
        const int b = inferlab::g_bf16_body.load();
        return std::string(b == inferlab::kBf16Rows ? "rows" : b == inferlab::kBf16Stream ? "stream" : "tiles");
      }, "the bf16 bodies' walk now: tiles, rows or stream");
  m.def("openmp", [] { return inferlab::kOpenMP; }, "whether this build splits work over OpenMP (else its own pool)");
#ifdef _OPENMP
  m.def("pool_threads", [] { return 0; }, "worker threads of the build's own pool (none: OpenMP's)");
#else
  m.def("pool_threads", [] { return inferlab::Pool::get().workers(); }, "worker threads the build's pool started");
#endif
}
