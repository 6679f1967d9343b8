#pragma once
/// \file
/// A SiDP layer owner (seed 002 §4.1): the FFN weights of the layers one rank
/// owns, packed for the CPU GEMM kernels, each layer in one region that peers
/// read with the communicator's one-sided get (WaS) and that the owning rank
/// computes with (its own layers, and CaS for its peers).
///
/// Region of layer l, named ffn_region_name(l), ffn_layout(...).bytes long:
/// gate_up ([2 * intermediate, hidden]) then down_proj ([hidden,
/// intermediate]), each as its packed parts, one per run of rows of one
/// format (Matrix::runs()), every part at a 64-byte-aligned offset and laid
/// out as kernels::cpu::PackedLinear::pack (F32, BF16) or
/// PackedQuantLinear::pack (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) lays it out. So a
/// copy of the region is directly usable through PackedWeight::view, and a
/// quantized file's FFN crosses the link as its quantized blocks (WaS moves
/// the bytes the kernels read: 4.5 bits per weight for Q4_K against 16 for
/// BF16). Layers may differ in format (a Q4_K_M file's Q6_K ffn_down on some
/// layers), so each layer has its own layout and size.
///
/// Killing an owner (unload) withdraws its regions and frees the weights;
/// readers then get not_found and wait. A respawned owner (load again)
/// repacks the weights from the host copy of the model (the loader's
/// ModelWeights, the bytes of the model files) and exposes them again; the
/// bytes are identical, so outputs are too.
///
/// Thread-safe: load/unload come from the owner's control thread, acquire
/// from the rank's compute thread; unload waits for leases in use.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "common/memory.hpp"
#include "common/result.hpp"
#include "kernels/cpu/weight_linear.hpp"
#include "model/sidp/ownership.hpp"
#include "model/weights.hpp"

namespace shardline::model::sidp {

/// One packed part of a layer's FFN matrix inside its region.
struct RegionPart {
  kernels::cpu::PackedPart part;  ///< format and size (part.data unused: null)
  std::size_t offset = 0;         ///< bytes from the region's start, 64-byte aligned
};

/// Byte layout of one layer's FFN region (see the file comment).
struct FfnLayout {
  DType dtype = DType::f32;  ///< dense regions (the CUDA layout): the weights' dtype
  int hidden = 0;
  int intermediate = 0;
  std::size_t gate_up_bytes = 0;  ///< gate_up's parts, from offset 0
  std::size_t down_offset = 0;    ///< where down's parts start, 64-byte aligned
  std::size_t down_bytes = 0;     ///< down's parts
  std::size_t bytes = 0;          ///< the whole region
  std::vector<RegionPart> gate_up_parts;  ///< CPU regions: gate_up's parts, in row order
  std::vector<RegionPart> down_parts;     ///< CPU regions: down's parts, in row order
};

/// The CPU layout of layer `lw`'s FFN region. Errors: what
/// kernels::cpu::packed_part_bytes returns for a part the kernels cannot
/// hold (named by the tensor).
[[nodiscard]] Result<FfnLayout> ffn_layout(const ModelConfig& config, const LayerWeights& lw, int layer);

/// "sidp.ffn.<layer>".
[[nodiscard]] std::string ffn_region_name(int layer);

/// Views of one layer's packed FFN matrices over a region (not owned).
struct FfnMatrices {
  kernels::cpu::PackedWeight gate_up;  // [2 * intermediate, hidden]
  kernels::cpu::PackedWeight down;     // [hidden, intermediate]
};
/// Views of the matrices in `region` (64-byte aligned, layout.bytes long).
/// Errors: invalid_argument (a layout PackedWeight::view refuses, or a
/// misaligned region).
[[nodiscard]] Result<FfnMatrices> ffn_views(const FfnLayout& layout, const void* region);

/// out[rows, hidden] = down(silu(x gate^T) * (x up^T)), x = [rows, hidden].
/// `gate_up` [rows, 2 * intermediate] and `act` [rows, intermediate] are
/// scratch. Row-wise batch-invariant (the kernels are, dense and quantized).
void ffn_forward(const FfnMatrices& w, const float* x, int rows, float* gate_up, float* act, float* out);

class LayerOwner {
 public:
  /// Not loaded yet: call load(). Errors: invalid_argument (rank outside the
  /// plan, plan and model disagree on the layer count), what ffn_layout
  /// returns for a layer.
  [[nodiscard]] static Result<std::unique_ptr<LayerOwner>> create(std::shared_ptr<const ModelWeights> weights,
                                                                  const OwnershipPlan& plan, int rank);
  ~LayerOwner();
  LayerOwner(const LayerOwner&) = delete;
  LayerOwner& operator=(const LayerOwner&) = delete;

  /// Packs the owned layers' FFN weights and exposes each region on `comm`
  /// (null: not exposed). No-op when loaded. Errors: out_of_memory, what
  /// expose returns.
  [[nodiscard]] Status load(comm::Communicator* comm);
  /// Withdraws the regions from `comm` (the one load exposed them on, or
  /// null), waits for leases in use, frees the weights. No-op when unloaded.
  void unload(comm::Communicator* comm);
  [[nodiscard]] bool loaded() const;

  /// Shared use of one owned layer's weights; unload waits for it.
  class Lease {
   public:
    [[nodiscard]] const FfnMatrices& matrices() const { return m_; }
   private:
    friend class LayerOwner;
    std::shared_lock<std::shared_mutex> lock_;
    FfnMatrices m_;
  };
  /// Waits up to `wait` for the owner to be loaded, then leases `layer`.
  /// Errors: invalid_argument (a layer this rank does not own), io (not
  /// loaded within `wait`: the owner is down and was not respawned).
  [[nodiscard]] Result<Lease> acquire(int layer, std::chrono::milliseconds wait);

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] const std::vector<int>& owned_layers() const { return owned_; }
  /// The region layout of `layer` (any layer of the model: peers read the
  /// layers other ranks own with it). Precondition: 0 <= layer < layers.
  [[nodiscard]] const FfnLayout& layout(int layer) const { return layouts_[static_cast<std::size_t>(layer)]; }
  /// [num_layers] the region bytes of every layer (what a WaS fetch moves).
  [[nodiscard]] std::vector<std::size_t> region_bytes() const;
  /// The FFN's format: "F32", "BF16", or the GGML types of its parts joined
  /// by '+' over every layer ("Q4_K+Q6_K").
  [[nodiscard]] const std::string& format_name() const { return format_; }
  /// Bytes of the owned layers' FFN weights (whether loaded or not).
  [[nodiscard]] std::size_t weight_bytes() const;
  /// Times load() packed the weights (1 after the first load; +1 per respawn).
  [[nodiscard]] std::uint64_t loads() const;

 private:
  LayerOwner(std::shared_ptr<const ModelWeights> weights, int rank, std::vector<int> owned,
             std::vector<FfnLayout> layouts, std::string format);

  std::shared_ptr<const ModelWeights> weights_;
  int rank_;
  std::vector<int> owned_;  ///< ascending
  std::vector<FfnLayout> layouts_;  ///< [num_layers]
  std::string format_;

  std::shared_mutex use_mu_;  ///< leases hold it shared, unload exclusive
  mutable std::mutex mu_;
  std::condition_variable loaded_cv_;
  bool loaded_ = false;
  std::uint64_t loads_ = 0;
  std::vector<AlignedBuffer> regions_;  ///< [owned] one region per owned layer
};

}  // namespace shardline::model::sidp
