#pragma once
/// \file
/// A linear layer's packed weight W [n, k] in the format it computes in:
/// dense (PackedLinear: F32 or BF16, kernels/cpu/linear.hpp) or kept
/// quantized (PackedQuantLinear: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K blocks with
/// integer dot products, kernels/cpu/quant_linear.hpp), or quantized parts
/// of different types stacked by rows (PackedQuantStack: a Q4_K_M file's
/// fused q/k/v with a Q6_K v), and the one `linear` call the model's layers
/// make on any of them (issue 40).
///
/// Both paths are batch-invariant (a row's result depends on nothing else
/// in the batch, the tiling or the thread count) and keep their own
/// exactness contract: the dense path's fixed per-element chain, the
/// quantized path's llama.cpp scalar arithmetic.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/result.hpp"

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/quant_linear.hpp"

namespace shardline::kernels::cpu {

/// W [n, k] as quantized parts stacked by rows, each [n_i, k] in its own
/// GGML type (sum of n_i = n): output columns [0, n_0) come from parts[0],
/// the next n_1 from parts[1], and so on. Each output is computed exactly
/// as the same row in a matrix of its part's type alone (quant_linear), so
/// stacking never changes a bit.
struct PackedQuantStack {
  std::vector<PackedQuantLinear> parts;  ///< at least two, one in_features
};

/// One packed part of a weight as bytes: its format, shape and where its
/// packed bytes are. What copying a packed weight elsewhere (a SiDP owner's
/// region, seed 002 §4.2) and viewing the copy there needs.
struct PackedPart {
  DType dtype = DType::f32;                ///< a dense part's element type (F32 or BF16)
  std::optional<GgmlType> quant;           ///< set: blocks of this type (dtype unused)
  int rows = 0;                            ///< output features of the part
  int cols = 0;                            ///< in_features
  std::size_t bytes = 0;                   ///< packed size
  const std::byte* data = nullptr;         ///< the packed bytes (64-byte aligned)
};

/// The packed size of a part of `rows` x `cols` in its format (what
/// PackedLinear::pack or PackedQuantLinear::pack allocate). Errors: as
/// PackedQuantLinear::packed_bytes; invalid_argument for a dense dtype other
/// than F32 or BF16.
[[nodiscard]] Result<std::size_t> packed_part_bytes(DType dtype, std::optional<GgmlType> quant, int rows, int cols);

/// A packed weight: empty, dense, quantized or a quantized stack. Movable,
/// not copyable.
class PackedWeight {
 public:
  PackedWeight() = default;
  PackedWeight(PackedLinear dense) : w_(std::move(dense)) {}        // NOLINT(google-explicit-constructor)
  PackedWeight(PackedQuantLinear quant) : w_(std::move(quant)) {}  // NOLINT(google-explicit-constructor)
  PackedWeight(PackedQuantStack stack) : w_(std::move(stack)) {}   // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool empty() const;
  [[nodiscard]] int out_features() const;  ///< n
  [[nodiscard]] int in_features() const;   ///< k
  [[nodiscard]] std::size_t bytes() const;  ///< packed bytes
  /// The dense weight, or null when quantized or empty.
  [[nodiscard]] const PackedLinear* dense() const { return std::get_if<PackedLinear>(&w_); }
  /// The quantized weight of one type, or null otherwise.
  [[nodiscard]] const PackedQuantLinear* quantized() const { return std::get_if<PackedQuantLinear>(&w_); }
  [[nodiscard]] PackedQuantLinear* quantized() { return std::get_if<PackedQuantLinear>(&w_); }
  /// The quantized stack, or null otherwise.
  [[nodiscard]] const PackedQuantStack* stack() const { return std::get_if<PackedQuantStack>(&w_); }
  /// The packed parts in row order (one, or a stack's parts), `data`
  /// pointing into this weight; empty when the weight is.
  [[nodiscard]] std::vector<PackedPart> parts() const;
  /// A weight over `parts` (their `data`, not owned, must outlive it): the
  /// part itself for one, a PackedQuantStack for several (all quantized, one
  /// cols). Errors: invalid_argument (no parts, several with a dense one,
  /// unequal cols, a size that is not the format's packed size, misaligned
  /// data), unsupported (a type the kernels do not keep quantized).
  [[nodiscard]] static Result<PackedWeight> view(std::span<const PackedPart> parts);
  /// "F32", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", a stack's part
  /// types joined by '+' ("Q4_K+Q6_K"); "" when empty.
  [[nodiscard]] std::string format_name() const;

 private:
  std::variant<std::monostate, PackedLinear, PackedQuantLinear, PackedQuantStack> w_;
};

/// y[m, n] = x[m, k] W^T (+ bias[n] if non-null), on either format (see
/// linear() and quant_linear() for strides, threading and rounding). A
/// quantized weight adds the bias after its dot product, in F32, as
/// llama.cpp adds a bias tensor after the matrix product. `side` is
/// prefetched by the dense path only (the quantized kernel ignores it; the
/// result is the same bits either way). Precondition: `w` is not empty, and
/// the strides are at least k and n (the model's layers pack the weights
/// they call this with; a violation throws std::logic_error, a programming
/// error).
void linear(const float* x, int m, int x_stride, const PackedWeight& w, const float* bias, float* y, int y_stride,
            LinePrefetchQueue* side = nullptr);

}  // namespace shardline::kernels::cpu
