#pragma once
/// \file
/// A SiDP layer owner on a CUDA device (seed 002 §4.1; issue 41 item 6): the
/// FFN weights of the layers one data-parallel rank owns, in its GPU's
/// memory, one region per layer in the CUDA runner's layout, exposed on a
/// device communicator so that the other ranks read them with one-sided
/// gets (WaS, §4.2: model/cuda/sidp/cuda_sidp_ffn.hpp) and the owning rank
/// computes with them in place.
///
/// Region of layer l, named sidp::ffn_region_name(l), cuda_ffn_layout().bytes:
///   [0, gate_up_bytes)                       gate_up [2 * intermediate, hidden]
///   [down_offset, down_offset + down_bytes)  down    [hidden, intermediate]
/// row major in the runner's weight dtype (model::upload_ffn_layer).
///
/// Killing an owner (unload) withdraws its regions (waiting for gets in
/// flight) and frees them; readers then get not_found and wait. load again
/// uploads from the host copy of the model: the bytes are identical.
/// Thread-safe: load / unload / region / acquire are serialised.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/ownership.hpp"
#include "model/weights.hpp"

namespace shardline::model::sidp {

/// The byte layout of one layer's FFN region on a CUDA device (the down
/// matrix 256-byte aligned). Matrices in `weight_dtype` (f32, bf16, f16).
[[nodiscard]] FfnLayout cuda_ffn_layout(const ModelConfig& config, DType weight_dtype);

class CudaLayerOwner {
 public:
  /// Owner of `rank`'s layers of `plan` on CUDA device `device`, not loaded.
  /// Errors: invalid_argument (rank outside the plan, a plan of another
  /// model, a weight dtype other than f32 / bf16 / f16).
  [[nodiscard]] static Result<std::shared_ptr<CudaLayerOwner>> create(const OwnershipPlan& plan, int rank, int device,
                                                                      const ModelConfig& config, DType weight_dtype);
  ~CudaLayerOwner();
  CudaLayerOwner(const CudaLayerOwner&) = delete;
  CudaLayerOwner& operator=(const CudaLayerOwner&) = delete;

  /// Uploads the owned layers from `host` (its matrices in host memory) and
  /// exposes them on `weights_comm` (this rank of the group the regions are
  /// read on; kept until unload). A no-op when loaded. Errors: out_of_memory
  /// naming the bytes, invalid_argument (a host copy without the matrices),
  /// internal, the communicator's.
  [[nodiscard]] Status load(const ModelWeights& host, comm::Communicator& weights_comm);
  /// Withdraws and frees the regions (readers get not_found until a load),
  /// once the leases taken before are dropped.
  void unload();
  [[nodiscard]] bool loaded() const;
  /// Owned layer `layer`'s region on the device; null when not owned or not loaded.
  [[nodiscard]] const void* region(int layer) const;

  /// Holds the owner's regions: unload waits until every lease is gone.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : owner_(o.owner_), region_(o.region_) { o.owner_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }
    /// The layer's region (device memory), valid while the lease lives.
    [[nodiscard]] const void* region() const { return region_; }
    void reset();

   private:
    friend class CudaLayerOwner;
    Lease(const CudaLayerOwner* owner, const void* region) : owner_(owner), region_(region) {}
    const CudaLayerOwner* owner_ = nullptr;
    const void* region_ = nullptr;
  };
  /// Owned layer `layer`'s region, waiting up to `timeout` for a load (a
  /// respawned owner); the regions stay until the lease is dropped.
  /// Errors: invalid_argument (a layer this rank does not own), io (not
  /// loaded within `timeout`).
  [[nodiscard]] Result<Lease> acquire(int layer, std::chrono::milliseconds timeout) const;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] const FfnLayout& layout() const { return layout_; }
  /// Device bytes of the owned layers' regions (0 when not loaded).
  [[nodiscard]] std::size_t bytes() const;

 private:
  CudaLayerOwner(const OwnershipPlan& plan, int rank, int device, FfnLayout layout)
      : plan_(plan), rank_(rank), device_(device), layout_(layout) {}
  void unload_locked();

  OwnershipPlan plan_;
  int rank_;
  int device_;
  FfnLayout layout_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  ///< a load, an unload or a lease dropped
  mutable int leases_ = 0;                    ///< leases alive
  comm::Communicator* comm_ = nullptr;                    ///< where the regions are exposed (while loaded)
  std::map<int, kernels::cuda::DeviceBuffer> regions_;   ///< by owned layer
};

}  // namespace shardline::model::sidp
