#include "model/weight_pack.hpp"

#include <cstdint>

namespace shardline::model {

namespace kc = kernels::cpu;

Result<kc::PackedWeight> pack_part(DType dtype, std::optional<kernels::GgmlType> type, const void* bytes, int rows,
                                   int cols, const std::string& what) {
  if (!type) return kc::PackedWeight(kc::PackedLinear::pack(bytes, dtype, rows, cols));
  const std::size_t row_bytes = *kernels::ggml_row_bytes(static_cast<std::uint32_t>(*type), cols);
  auto packed = kc::PackedQuantLinear::pack(
      *type, {static_cast<const std::uint8_t*>(bytes), static_cast<std::size_t>(rows) * row_bytes}, rows, cols);
  if (!packed.ok()) return make_error(packed.error().code, what + ": " + packed.error().message);
  return kc::PackedWeight(std::move(packed).value());
}

}  // namespace shardline::model
