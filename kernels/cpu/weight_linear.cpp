#include "kernels/cpu/weight_linear.hpp"

#include <stdexcept>

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
