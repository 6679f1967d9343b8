#pragma once
/// \file
/// llama.cpp's GGML tensor types (the element types of GGUF files) and their
/// reference dequantization. Each `dequantize_row` is the scalar reference of
/// ggml-quants.c's `dequantize_row_*` for that type, with the same operations
/// in the same order (compiled without FMA contraction), so the results are
/// bit-identical to llama.cpp's and to the `gguf` Python package's
/// `gguf.quants.dequantize` (tests/kernels/ggml_quants_test.cpp checks every
/// type against the latter; Q8_K, which `gguf` does not dequantize, against
/// ggml-quants.c's definition written out in tests/kernels/ggml_quants_oracle.py).
///
/// Block layouts (bytes; `f16` is IEEE half, QK_K = 256):
///   Q4_0 [32]:  f16 d, u8 qs[16]                                 18
///   Q4_1 [32]:  f16 d, f16 m, u8 qs[16]                          20
///   Q5_0 [32]:  f16 d, u8 qh[4], u8 qs[16]                       22
///   Q5_1 [32]:  f16 d, f16 m, u8 qh[4], u8 qs[16]                24
///   Q8_0 [32]:  f16 d, i8 qs[32]                                 34
///   Q2_K [256]: u8 scales[16], u8 qs[64], f16 d, f16 dmin        84
///   Q3_K [256]: u8 hmask[32], u8 qs[64], u8 scales[12], f16 d    110
///   Q4_K [256]: f16 d, f16 dmin, u8 scales[12], u8 qs[128]       144
///   Q5_K [256]: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]  176
///   Q6_K [256]: u8 ql[128], u8 qh[64], i8 scales[16], f16 d      210
///   Q8_K [256]: f32 d, i8 qs[256], i16 bsums[16]                 292
/// The loader dequantizes at load, or with `--dtype auto` keeps Q8_0, Q4_0
/// and Q4_1 matrices as blocks for kernels/cpu/quant_linear.hpp (issue 40).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/result.hpp"

namespace shardline::kernels {

/// GGML type ids as written in GGUF tensor infos (ggml.h `enum ggml_type`).
enum class GgmlType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};

/// Size facts of a type: `block_size` elements are stored in `type_size`
/// bytes; a row of n elements (n a multiple of block_size) takes
/// n / block_size * type_size bytes.
struct GgmlTypeTraits {
  GgmlType type = GgmlType::f32;
  const char* name = "";   ///< llama.cpp's name: "F32", "Q4_K", ...
  int block_size = 1;      ///< elements per block
  int type_size = 4;       ///< bytes per block
  bool can_dequantize = false;  ///< dequantize_row handles it (all but Q8_1)
};

/// The traits of type id `type`, or nullopt for an id this build does not
/// know (the IQ and ternary types, removed ids, garbage).
[[nodiscard]] std::optional<GgmlTypeTraits> ggml_type_traits(std::uint32_t type) noexcept;

/// "Q4_K", or "type 17" for an unknown id (for error messages).
[[nodiscard]] std::string ggml_type_name(std::uint32_t type);

/// Bytes of a row of `num_elements` elements of `type`; nullopt when the type
/// is unknown or `num_elements` is not a multiple of its block size.
[[nodiscard]] std::optional<std::size_t> ggml_row_bytes(std::uint32_t type, std::int64_t num_elements) noexcept;

/// Dequantizes `num_elements` elements (a multiple of the type's block size)
/// from `src` (blocks of `type`, any alignment) into `dst` [num_elements] F32,
/// exactly as llama.cpp's `dequantize_row_*`.
/// Errors: unsupported (a type without a dequantization here, named),
/// invalid_argument (num_elements not a multiple of the block size).
[[nodiscard]] Status dequantize_row(GgmlType type, const void* src, float* dst, std::int64_t num_elements);

}  // namespace shardline::kernels
