#pragma once
/// \file
/// A SiDP layer owner (seed 002 §4.1): the FFN weights of the layers one rank
/// owns, packed for the CPU GEMM kernels, each layer in one region that peers
/// read with the communicator's one-sided get (WaS) and that the owning rank
/// computes with (its own layers, and CaS for its peers).
///
/// Region of layer l, named ffn_region_name(l), FfnLayout::bytes long:
///   [0, gate_up_bytes)                 gate_up packed ([2 * intermediate, hidden])
///   [down_offset, down_offset + down_bytes)  down_proj packed ([hidden, intermediate])
/// laid out as kernels::cpu::PackedLinear::pack lays them out, so a copy of
/// the region is directly usable through PackedLinear::view.
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
#include "kernels/cpu/linear.hpp"
#include "model/sidp/ownership.hpp"
#include "model/weights.hpp"

namespace shardline::model::sidp {

/// Byte layout of one layer's FFN region (see the file comment).
struct FfnLayout {
  DType dtype = DType::f32;
  int hidden = 0;
  int intermediate = 0;
  std::size_t gate_up_bytes = 0;
  std::size_t down_offset = 0;  ///< gate_up_bytes rounded up to 64
  std::size_t down_bytes = 0;
  std::size_t bytes = 0;        ///< the whole region
};
[[nodiscard]] FfnLayout ffn_layout(const ModelConfig& config, DType dtype);

/// "sidp.ffn.<layer>".
[[nodiscard]] std::string ffn_region_name(int layer);

/// Views of one layer's packed FFN matrices over a region (not owned).
struct FfnMatrices {
  kernels::cpu::PackedLinear gate_up;  // [2 * intermediate, hidden]
  kernels::cpu::PackedLinear down;     // [hidden, intermediate]
};
[[nodiscard]] FfnMatrices ffn_views(const FfnLayout& layout, const void* region);

/// out[rows, hidden] = down(silu(x gate^T) * (x up^T)), x = [rows, hidden].
/// `gate_up` [rows, 2 * intermediate] and `act` [rows, intermediate] are
/// scratch. Row-wise batch-invariant (the kernels are).
void ffn_forward(const FfnMatrices& w, const float* x, int rows, float* gate_up, float* act, float* out);

class LayerOwner {
 public:
  /// Not loaded yet: call load(). Errors: invalid_argument (rank outside the
  /// plan, plan and model disagree on the layer count).
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
  [[nodiscard]] const FfnLayout& layout() const { return layout_; }
  /// Bytes of the owned layers' FFN weights (whether loaded or not).
  [[nodiscard]] std::size_t weight_bytes() const { return layout_.bytes * owned_.size(); }
  /// Times load() packed the weights (1 after the first load; +1 per respawn).
  [[nodiscard]] std::uint64_t loads() const;

 private:
  LayerOwner(std::shared_ptr<const ModelWeights> weights, int rank, std::vector<int> owned, FfnLayout layout);

  std::shared_ptr<const ModelWeights> weights_;
  int rank_;
  std::vector<int> owned_;  ///< ascending
  FfnLayout layout_;

  std::shared_mutex use_mu_;  ///< leases hold it shared, unload exclusive
  mutable std::mutex mu_;
  std::condition_variable loaded_cv_;
  bool loaded_ = false;
  std::uint64_t loads_ = 0;
  std::vector<AlignedBuffer> regions_;  ///< [owned] one region per owned layer
};

}  // namespace shardline::model::sidp
