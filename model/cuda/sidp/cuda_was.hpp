#pragma once
/// \file
/// SiDP's Weights-as-a-Service (seed 002 §4.2; issue 41 item 6) on CUDA
/// devices: one data-parallel rank's FFN weights for the CUDA runner
/// (model::CudaFfnWeights). The rank holds only the FFN layers it owns (its
/// CudaLayerOwner, in its GPU's memory); every other layer's weights come
/// into a ring of cache slots in its GPU's memory, filled ahead of the
/// compute by the housekeeper of model::sidp::WeightCache (the same ring,
/// prefetch order and peak shifting as on CPU devices), whose one-sided gets
/// are device copies on its communicator's own stream
/// (model::InProcDeviceCommunicator: within a GPU, or a peer copy between
/// two). The runner runs the GEMMs on its stream with the slot's weights and
/// waits for them before releasing the slot.
///
/// Differences from the paper's setting, as built here:
///  - the ranks are threads of one process (the node's), the gets device
///    copies through unified addressing (no CUDA IPC between processes, no
///    NCCL: it has no one-sided reads);
///  - a get is waited for on the host before its slot is marked ready, and
///    the runner waits for its stream before a release: overlap of transfer
///    and compute comes from the housekeeper's thread and stream, not from
///    events between the streams.
/// CaS (§4.3) and the orchestrator's mode switching on CUDA are not built
/// yet: these ranks run WaS only.

#include <memory>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/sidp/cuda_layer_owner.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/weight_cache.hpp"

namespace shardline::model::sidp {

class CudaWas final : public CudaFfnWeights {
 public:
  /// Rank `owner->rank()` of `plan` on the owner's GPU. `weights_comm` is
  /// this rank of the group the owners expose their regions on (an
  /// InProcDeviceCommunicator; used by the housekeeper only, not owned).
  /// `cache.slot_memory` is set here (slots in the GPU's memory).
  /// Errors: invalid_argument (no owner or communicator, a rank other than
  /// the communicator's), out_of_memory (the slots), what WeightCache::create
  /// returns.
  [[nodiscard]] static Result<std::shared_ptr<CudaWas>> create(const OwnershipPlan& plan,
                                                               std::shared_ptr<CudaLayerOwner> owner,
                                                               comm::Communicator* weights_comm,
                                                               WeightCacheOptions cache, bool peak_shifting);
  ~CudaWas() override;

  /// An owned layer: its region (internal when the owner is not loaded);
  /// a remote one: the cache slot holding it (waiting for the fetch).
  [[nodiscard]] Result<CudaFfnLayerWeights> acquire(int layer) override;
  void release(int layer) override;
  /// Drops the ring's slots and restarts the prefetch order.
  void abort_step() override;

  /// Slots of the ring (0 when the rank owns every layer).
  [[nodiscard]] int cache_slots() const { return cache_ ? cache_->slots() : 0; }
  /// Device bytes this rank holds for FFNs: its owned layers plus its slots.
  [[nodiscard]] std::size_t ffn_weight_bytes() const;
  [[nodiscard]] WeightCacheStats cache_stats() const;
  [[nodiscard]] CudaLayerOwner& owner() { return *owner_; }

 private:
  CudaWas(const OwnershipPlan& plan, std::shared_ptr<CudaLayerOwner> owner) : plan_(plan), owner_(std::move(owner)) {}
  [[nodiscard]] CudaFfnLayerWeights split(const void* region) const;

  OwnershipPlan plan_;
  std::shared_ptr<CudaLayerOwner> owner_;
  std::unique_ptr<WeightCache> cache_;  ///< null when the rank owns every layer
};

}  // namespace shardline::model::sidp
