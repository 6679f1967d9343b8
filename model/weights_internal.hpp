#pragma once
/// \file
/// Private helpers shared by the safetensors loader (loader.cpp) and the dummy
/// weight generator (dummy.cpp). Not part of the public model API.

#include <cstddef>
#include <string>

#include "common/result.hpp"
#include "model/weights.hpp"

namespace shardline::model::detail {

/// Alignment of every weight buffer, in bytes.
inline constexpr std::size_t kWeightAlignment = 64;

/// Allocates a 64-byte-aligned, uninitialised buffer of `bytes` bytes, keeps it
/// in `w.storage` and returns a writable pointer to it. out_of_memory (naming
/// `what`) when the allocation fails.
[[nodiscard]] Result<void*> allocate_storage(ModelWeights& w, std::size_t bytes,
                                             const std::string& what);

/// invalid_argument unless `dtype` is f32 or bf16 (the storage dtypes).
[[nodiscard]] Status check_storage_dtype(DType dtype);

/// Weights with nothing loaded yet: `config` with num_hidden_layers cut to
/// `options.num_layers_override` when that is in (0, num_hidden_layers],
/// storage dtype `options.dtype`, one empty LayerWeights per kept layer.
/// Shared by the safetensors, GGUF and dummy loaders.
[[nodiscard]] ModelWeights empty_weights(const ModelConfig& config, const LoadOptions& options);

/// Converts `n` elements from `src` (dtype `src_dtype`, possibly unaligned) into
/// `dst` (dtype `dst_dtype`, f32 or bf16). Large copies run OpenMP-parallel.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n);

}  // namespace shardline::model::detail
