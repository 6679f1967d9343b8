#include "kernels/cpu/weight_linear.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardline::kernels::cpu {

bool PackedWeight::empty() const {
  if (const auto* d = dense()) return d->empty();
  if (const auto* q = quantized()) return q->empty();
  if (const auto* st = stack()) return st->parts.empty();
  return true;
}

int PackedWeight::out_features() const {
  if (const auto* d = dense()) return d->out_features();
  if (const auto* q = quantized()) return q->out_features();
  if (const auto* st = stack()) {
    int n = 0;
    for (const PackedQuantLinear& p : st->parts) n += p.out_features();
    return n;
  }
  return 0;
}

int PackedWeight::in_features() const {
  if (const auto* d = dense()) return d->in_features();
  if (const auto* q = quantized()) return q->in_features();
  if (const auto* st = stack()) return st->parts.empty() ? 0 : st->parts.front().in_features();
  return 0;
}

std::size_t PackedWeight::bytes() const {
  if (const auto* d = dense()) return d->bytes();
  if (const auto* q = quantized()) return q->bytes();
  if (const auto* st = stack()) {
    std::size_t b = 0;
    for (const PackedQuantLinear& p : st->parts) b += p.bytes();
    return b;
  }
  return 0;
}

Result<std::size_t> packed_part_bytes(DType dtype, std::optional<GgmlType> quant, int rows, int cols) {
  if (quant) return PackedQuantLinear::packed_bytes(*quant, rows, cols);
  if (dtype != DType::f32 && dtype != DType::bf16)
    return make_error(ErrorCode::invalid_argument,
                      std::string("packed weight: a dense part of ") + dtype_name(dtype) + " (F32 or BF16)");
  if (rows < 1 || cols < 1)
    return make_error(ErrorCode::invalid_argument, "packed weight: a [" + std::to_string(rows) + ", " +
                                                       std::to_string(cols) + "] part");
  return PackedLinear::packed_bytes(dtype, rows, cols);
}

std::vector<PackedPart> PackedWeight::parts() const {
  auto quant_part = [](const PackedQuantLinear& q) {
    return PackedPart{DType::f32, q.type(), q.out_features(), q.in_features(), q.bytes(), q.data()};
  };
  if (const auto* d = dense(); d != nullptr && !d->empty())
    return {PackedPart{d->dtype(), std::nullopt, d->out_features(), d->in_features(), d->bytes(),
                       static_cast<const std::byte*>(d->data())}};
  if (const auto* q = quantized(); q != nullptr && !q->empty()) return {quant_part(*q)};
  std::vector<PackedPart> out;
  if (const auto* st = stack())
    for (const PackedQuantLinear& p : st->parts) out.push_back(quant_part(p));
  return out;
}

Result<PackedWeight> PackedWeight::view(std::span<const PackedPart> parts) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "packed weight view: " + m); };
  if (parts.empty()) return bad("no parts");
  for (const PackedPart& p : parts) {
    auto want = packed_part_bytes(p.dtype, p.quant, p.rows, p.cols);
    if (!want.ok()) return want.error();
    if (p.bytes != *want)
      return bad(std::to_string(p.bytes) + " bytes for a part that packs into " + std::to_string(*want));
    if (reinterpret_cast<std::uintptr_t>(p.data) % 64 != 0) return bad("a part's data is not 64-byte aligned");
    if (p.cols != parts.front().cols) return bad("parts of unequal in_features");
    if (parts.size() > 1 && !p.quant) return bad("a dense part in a stack (only quantized parts stack)");
  }
  if (!parts.front().quant) {
    const PackedPart& p = parts.front();
    return PackedWeight(PackedLinear::view(p.data, p.dtype, p.rows, p.cols));
  }
  std::vector<PackedQuantLinear> views;
  for (const PackedPart& p : parts) {
    auto v = PackedQuantLinear::view(p.data, *p.quant, p.rows, p.cols);
    if (!v.ok()) return v.error();
    views.push_back(std::move(v).value());
  }
  if (views.size() == 1) return PackedWeight(std::move(views.front()));
  return PackedWeight(PackedQuantStack{std::move(views)});
}

std::string PackedWeight::format_name() const {
  if (const auto* d = dense()) return dtype_name(d->dtype());
  if (const auto* q = quantized()) return ggml_type_name(static_cast<std::uint32_t>(q->type()));
  std::string out;
  if (const auto* st = stack())
    for (const PackedQuantLinear& p : st->parts) {
      const std::string name = ggml_type_name(static_cast<std::uint32_t>(p.type()));
      if (out.find(name) == std::string::npos) out += (out.empty() ? "" : "+") + name;
    }
  return out;
}

void linear(const float* x, int m, int x_stride, const PackedWeight& w, const float* bias, float* y, int y_stride,
            LinePrefetchQueue* side) {
  if (const PackedLinear* d = w.dense()) {
    linear(x, m, x_stride, *d, bias, y, y_stride, side);
    return;
  }
  int n = 0;  // output columns written
  if (const PackedQuantLinear* q = w.quantized()) {
    if (Status s = quant_linear(x, m, x_stride, *q, y, y_stride); !s.ok())
      throw std::logic_error("linear: " + s.error().message);
    n = q->out_features();
  } else if (const PackedQuantStack* st = w.stack()) {
    for (const PackedQuantLinear& part : st->parts) {
      if (Status s = quant_linear(x, m, x_stride, part, y + n, y_stride); !s.ok())
        throw std::logic_error("linear: " + s.error().message);
      n += part.out_features();
    }
  }
  if (n == 0) throw std::logic_error("linear: an empty weight");
  if (bias == nullptr) return;
  for (int i = 0; i < m; ++i) {
    float* row = y + static_cast<std::ptrdiff_t>(i) * y_stride;
    for (int j = 0; j < n; ++j) row[j] += bias[j];
  }
}

}  // namespace shardline::kernels::cpu
