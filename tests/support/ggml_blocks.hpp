#pragma once
// Random GGUF blocks for tests of the quantized kernels and models: every
// byte pattern of Q8_0, Q4_0, Q4_1, Q4_K and Q6_K values and packed scales is
// a valid block, so rows are random bytes with sane random F16 scales
// written over them.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.hpp"
#include "kernels/cpu/ggml_quants.hpp"

namespace shardline::testing_support {

/// True for the K-quants (256-element super-blocks, Q8_K activations).
inline bool is_k_quant(kernels::GgmlType t) { return t == kernels::GgmlType::q4_k || t == kernels::GgmlType::q6_k; }

/// `rows` rows of `cols` elements (whole blocks) of `type`: random values
/// (Q8_0 covers -128 .. 127: a file may hold -128), d uniform in +-0.02
/// (the K-quants' / 16, as they multiply 6- or 8-bit scales), and the
/// F16 minimum (Q4_1's m: +-0.16; Q4_K's dmin: +-0.01).
inline std::vector<std::uint8_t> random_ggml_blocks(kernels::GgmlType type, int rows, int cols, std::mt19937& rng) {
  using kernels::GgmlType;
  const std::size_t row_bytes = *kernels::ggml_row_bytes(static_cast<std::uint32_t>(type), cols);
  std::vector<std::uint8_t> w(static_cast<std::size_t>(rows) * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : w) v = static_cast<std::uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const auto traits = *kernels::ggml_type_traits(static_cast<std::uint32_t>(type));
  const std::size_t block_bytes = static_cast<std::size_t>(traits.type_size);
  const std::size_t d_at = type == GgmlType::q6_k ? 208 : 0;  // where the F16 d is
  const bool has_min = type == GgmlType::q4_1 || type == GgmlType::q4_k;
  for (std::size_t at = 0; at < w.size(); at += block_bytes) {
    const std::uint16_t h = f32_to_f16(is_k_quant(type) ? scale(rng) / 16.0f : scale(rng));
    std::memcpy(w.data() + at + d_at, &h, 2);
    if (has_min) {
      const std::uint16_t m = f32_to_f16(scale(rng) * (type == GgmlType::q4_k ? 0.5f : 8.0f));
      std::memcpy(w.data() + at + 2, &m, 2);
    }
  }
  return w;
}

}  // namespace shardline::testing_support
