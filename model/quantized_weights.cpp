// Matrices kept as GGUF blocks (issue 40): which types stay quantized, row
// reads, and the dense copy for runners that compute on dense weights only.
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/quant_linear.hpp"
#include "model/weights.hpp"
#include "model/weights_internal.hpp"

namespace shardline::model {

bool matrix_stays_quantized(kernels::GgmlType type) {
  using kernels::GgmlType;
  return type == GgmlType::q8_0 || type == GgmlType::q4_0 || type == GgmlType::q4_1 || type == GgmlType::q4_k ||
         type == GgmlType::q6_k;
}

void matrix_row_f32(const Matrix& m, int row, float* out) {
  const std::byte* src = m.row_data(row);
  if (const auto type = m.row_type(row)) {
    // Cannot fail: the loader checked the type and the row's length.
    (void)kernels::dequantize_row(*type, src, out, m.cols);
    return;
  }
  detail::convert_elements(src, m.dtype, out, DType::f32, static_cast<std::size_t>(m.cols));
}

namespace {

/// Calls fn(matrix, name) on every matrix of `w` (llama.cpp's tensor names,
/// the fused ones attn_qkv and ffn_gate_up), the token table first, and
/// stops at the first error. A tied lm_head is not visited: it is made the
/// token table again afterwards (`w` non-const).
template <class Weights, class Fn>
Status for_each_matrix(Weights& w, Fn&& fn) {
  const bool tied = w.lm_head.data == w.embed_tokens.data;
  if (Status s = fn(w.embed_tokens, "token_embd"); !s.ok()) return s;
  if (!tied)
    if (Status s = fn(w.lm_head, "output"); !s.ok()) return s;
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    auto& l = w.layers[i];
    const std::string b = "blk." + std::to_string(i) + ".";
    for (auto [m, name] : {std::pair{&l.qkv, "attn_qkv"}, {&l.o_proj, "attn_output"}, {&l.gate_up, "ffn_gate_up"},
                           {&l.down_proj, "ffn_down"}})
      if (Status s = fn(*m, b + name); !s.ok()) return s;
  }
  if constexpr (!std::is_const_v<Weights>)
    if (tied) w.lm_head = w.embed_tokens;
  return Status::ok_status();
}

/// A dense copy of quantized `m` in `w`'s storage dtype, kept in `w.storage`.
Status dequantize_into(ModelWeights& w, Matrix& m, const std::string& what) {
  if (!m.quantized()) return Status::ok_status();
  const std::size_t elem = dtype_size(w.dtype);
  auto buf = detail::allocate_storage(w, static_cast<std::size_t>(m.rows) * m.cols * elem, what);
  if (!buf.ok()) return buf.error();
  auto* dst = static_cast<std::byte*>(buf.value());
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(m.cols));  // [cols] F32
#pragma omp for schedule(static)
    for (int r = 0; r < m.rows; ++r) {
      matrix_row_f32(m, r, row.data());
      detail::convert_elements(row.data(), DType::f32, dst + static_cast<std::size_t>(r) * m.cols * elem, w.dtype,
                               static_cast<std::size_t>(m.cols));
    }
  }
  m = Matrix{w.dtype, m.rows, m.cols, buf.value(), std::nullopt, {}};
  return Status::ok_status();
}

/// Replaces dense F32 `m` by its blocks of `type` in new storage of `w`.
Status quantize_into(ModelWeights& w, Matrix& m, kernels::GgmlType type, const std::string& what) {
  if (m.quantized() || m.empty()) return Status::ok_status();
  if (m.dtype != DType::f32)
    return make_error(ErrorCode::invalid_argument, "quantize " + what + ": the source is " +
                                                       std::string(dtype_name(m.dtype)) + ", not F32");
  const auto row_bytes = kernels::ggml_row_bytes(static_cast<std::uint32_t>(type), m.cols);
  if (!row_bytes)
    return make_error(ErrorCode::invalid_argument, "quantize " + what + ": " + std::to_string(m.cols) +
                                                       " columns are not whole blocks of " +
                                                       kernels::ggml_type_name(static_cast<std::uint32_t>(type)));
  auto buf = detail::allocate_storage(w, static_cast<std::size_t>(m.rows) * *row_bytes, what);
  if (!buf.ok()) return buf.error();
  auto* dst = static_cast<std::byte*>(buf.value());
  const auto* src = static_cast<const float*>(m.data);
  Status failed = Status::ok_status();
#pragma omp parallel for schedule(static)
  for (int r = 0; r < m.rows; ++r) {
    Status s = kernels::cpu::quantize_row(type, src + static_cast<std::size_t>(r) * m.cols, m.cols,
                                          dst + static_cast<std::size_t>(r) * *row_bytes);
    if (!s.ok()) {
#pragma omp critical
      failed = s;
    }
  }
  if (!failed.ok()) return make_error(failed.error().code, "quantize " + what + ": " + failed.error().message);
  // Free the F32 buffer (the loaders give each matrix its own).
  const void* old = m.data;
  std::erase_if(w.storage, [old](const std::shared_ptr<void>& p) { return p.get() == old; });
  m = Matrix{w.dtype, m.rows, m.cols, buf.value(), type, {}};
  return Status::ok_status();
}

}  // namespace

Result<ModelWeights> quantize_weights(ModelWeights w, kernels::GgmlType type, DType dtype) {
  if (type != kernels::GgmlType::q8_0 && type != kernels::GgmlType::q4_0 && type != kernels::GgmlType::q4_1)
    return make_error(ErrorCode::unsupported, "--quantization " + kernels::ggml_type_name(static_cast<std::uint32_t>(type)) +
                                                  ": this build quantizes to Q8_0, Q4_0 and Q4_1");
  w.dtype = dtype;  // what each quantized Matrix records
  if (Status s = for_each_matrix(w, [&](Matrix& m, const std::string& name) { return quantize_into(w, m, type, name); });
      !s.ok())
    return s.error();
  return w;
}

Result<std::shared_ptr<const ModelWeights>> dequantized_weights(std::shared_ptr<const ModelWeights> weights) {
  bool any = false;
  (void)for_each_matrix(*weights, [&any](const Matrix& m, const std::string&) {
    any = any || m.quantized();
    return Status::ok_status();
  });
  if (!any) return weights;
  auto out = std::make_shared<ModelWeights>(*weights);  // shares the storage the dense views point into
  if (Status s = for_each_matrix(*out, [&](Matrix& m, const std::string& name) { return dequantize_into(*out, m, name); });
      !s.ok())
    return s.error();
  return std::shared_ptr<const ModelWeights>(std::move(out));
}

}  // namespace shardline::model
