#include "kernels/cpu/weight_linear.hpp"

#include <stdexcept>

namespace shardline::kernels::cpu {

bool PackedWeight::empty() const {
  if (const auto* d = dense()) return d->empty();
  if (const auto* q = quantized()) return q->empty();
  return true;
}

int PackedWeight::out_features() const {
  if (const auto* d = dense()) return d->out_features();
  if (const auto* q = quantized()) return q->out_features();
  return 0;
}

int PackedWeight::in_features() const {
  if (const auto* d = dense()) return d->in_features();
  if (const auto* q = quantized()) return q->in_features();
  return 0;
}

std::size_t PackedWeight::bytes() const {
  if (const auto* d = dense()) return d->bytes();
  if (const auto* q = quantized()) return q->bytes();
  return 0;
}

std::string PackedWeight::format_name() const {
  if (const auto* d = dense()) return dtype_name(d->dtype());
  if (const auto* q = quantized()) return ggml_type_name(static_cast<std::uint32_t>(q->type()));
  return "";
}

void linear(const float* x, int m, int x_stride, const PackedWeight& w, const float* bias, float* y, int y_stride,
            LinePrefetchQueue* side) {
  if (const PackedLinear* d = w.dense()) {
    linear(x, m, x_stride, *d, bias, y, y_stride, side);
    return;
  }
  const PackedQuantLinear* q = w.quantized();
  if (q == nullptr) throw std::logic_error("linear: an empty weight");
  if (Status s = quant_linear(x, m, x_stride, *q, y, y_stride); !s.ok())
    throw std::logic_error("linear: " + s.error().message);
  if (bias == nullptr) return;
  const int n = q->out_features();
  for (int i = 0; i < m; ++i) {
    float* row = y + static_cast<std::ptrdiff_t>(i) * y_stride;
    for (int j = 0; j < n; ++j) row[j] += bias[j];
  }
}

}  // namespace shardline::kernels::cpu
