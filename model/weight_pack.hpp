#pragma once
/// \file
/// One run of a Matrix's rows packed for the CPU kernels, in its own format:
/// what ShardRunner packs its shards from and SiDP's layer owners pack their
/// regions from (model/sidp/layer_owner.hpp).

#include <optional>
#include <string>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "kernels/cpu/weight_linear.hpp"
#include "kernels/cpu/ggml_quants.hpp"

namespace shardline::model {

/// Packs [rows, cols] whose rows are `bytes`: dense in `dtype` (F32 or BF16,
/// kernels::cpu::PackedLinear) when `type` is unset, else GGUF blocks of
/// `type` (kernels::cpu::PackedQuantLinear). Errors: what
/// PackedQuantLinear::pack returns, its message prefixed with `what` (the
/// tensor's name).
[[nodiscard]] Result<kernels::cpu::PackedWeight> pack_part(DType dtype, std::optional<kernels::GgmlType> type,
                                                          const void* bytes, int rows, int cols,
                                                          const std::string& what);

}  // namespace shardline::model
