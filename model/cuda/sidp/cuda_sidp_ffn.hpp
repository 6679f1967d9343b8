#pragma once
/// \file
/// One SiDP data-parallel rank on a CUDA device (seed 002 §4; issue 41 item
/// 6): the CudaFfnExecutor its CudaModelRunner calls for every decoder
/// layer's FFN. The rank holds only the FFN layers it owns (its
/// CudaLayerOwner, in its GPU's memory); the others run in the group's mode
/// (the protocol, shared with CPU ranks: model/sidp/sidp_rank_ffn.hpp):
///
///  - WaS (§4.2): the layer's weights come into a ring of cache slots in the
///    GPU's memory, filled ahead of the compute by the housekeeper of
///    model::sidp::WeightCache (the same ring, prefetch order and peak
///    shifting as on CPU devices) with one-sided gets that are device copies
///    on the weights communicator's own stream (within a GPU, or a peer copy
///    between two). The runner's FFN math runs on the slot; the rank waits
///    for the runner's stream before it releases the slot.
///  - CaS (§4.3): the rank waits for its stream, sends its rows
///    x [rows, hidden] F32 (device) to the owner and receives the FFN output
///    into a device buffer, which the runner's stream adds into the residual.
///    The owner copies its own rows into a device staging buffer
///    [total rows, hidden], receives every non-dummy peer's rows right after
///    them (rank order), runs ONE fused GEMM chain over all of them with its
///    resident weights (GEMM fusion; in chunks of the runner's activation
///    rows when more), adds its slice into its residual and, once its stream
///    is done, sends each peer its slice.
///
/// Communicators (ranks are threads of one process, the node's):
///  - weights: model::InProcDeviceCommunicator ranks (the owners expose
///    their regions on it; the housekeeper gets from it);
///  - compute: InProcDeviceCommunicator ranks of another group, for the CaS
///    rows (device send / recv, a peer copy between GPUs); the step control
///    all-gathers run on the host communicator it wraps.
///
/// Differences from the paper's setting, as built here:
///  - no CUDA IPC between processes and no NCCL (it has no one-sided reads):
///    the gets and the CaS rows are device copies through unified
///    addressing;
///  - a get is waited for on the host before its slot is marked ready, and
///    every FFN waits for the runner's stream on the host (the runner runs
///    no decode graphs): overlap of transfer and compute comes from the
///    housekeeper's thread and stream, not from events between the streams;
///  - the CaS staging buffers grow on demand in the GPU's memory (the
///    memory plan does not count them; CaS runs on small batches).
/// WaS, CaS and plain DP give bit-identical rows in deterministic mode
/// (batch-invariant GEMMs); the fast GEMMs may differ in the last bits with
/// the fused batch.

#include <chrono>
#include <memory>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/sidp/cuda_layer_owner.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/sidp_rank_ffn.hpp"
#include "model/sidp/weight_cache.hpp"

namespace shardline::model::sidp {

class CudaSidpFfn final : public CudaFfnExecutor, public SidpRankFfn {
 public:
  /// Rank `owner->rank()` of `plan` on the owner's GPU. `weights_comm` is
  /// this rank of the group the owners expose their regions on (used by the
  /// housekeeper only); `compute_comm` an InProcDeviceCommunicator of
  /// another group over the same ranks, or null (WaS only until rebind).
  /// Neither is owned. options.cache.slot_memory is set here (slots in the
  /// GPU's memory). Errors: invalid_argument (no owner, mismatched ranks or
  /// communicators, a compute communicator that is not an
  /// InProcDeviceCommunicator), out_of_memory (the slots), what
  /// WeightCache::create returns.
  [[nodiscard]] static Result<std::shared_ptr<CudaSidpFfn>> create(const OwnershipPlan& plan,
                                                                   std::shared_ptr<CudaLayerOwner> owner,
                                                                   comm::Communicator* weights_comm,
                                                                   comm::Communicator* compute_comm,
                                                                   SidpFfnOptions options);
  ~CudaSidpFfn() override;

  // ---- CudaFfnExecutor ------------------------------------------------------
  void bind(CudaFfnCompute* compute) override { compute_ = compute; }
  [[nodiscard]] Status begin_step(int num_rows) override { return begin_control(num_rows); }
  [[nodiscard]] Status forward(int layer, const float* x, int rows, float* residual) override;
  void end_step() override {}
  void abort_step() override;

  /// Device bytes this rank holds for FFNs: its owned layers plus its slots
  /// (not the CaS staging buffers).
  [[nodiscard]] std::size_t ffn_weight_bytes() const override;
  [[nodiscard]] CudaLayerOwner& owner() { return *owner_; }

 private:
  CudaSidpFfn(const OwnershipPlan& plan, std::shared_ptr<CudaLayerOwner> owner, comm::Communicator* weights_comm,
              SidpMode initial_mode);
  [[nodiscard]] Result<comm::Communicator*> control_of(comm::Communicator* compute) override;
  [[nodiscard]] Status serve(int layer, const float* x, int num_rows, float* out) override;  // CaS owner
  /// WaS, or an owned layer outside CaS: the weights here, the runner's math.
  [[nodiscard]] Status run_was(int layer, const float* x, int rows, float* residual);
  /// CaS, a layer another rank owns.
  [[nodiscard]] Status run_cas_remote(int layer, const float* x, int rows, float* residual);
  /// The owned layer's region as the runner's weights. Errors: internal (not loaded).
  [[nodiscard]] Result<CudaFfnLayerWeights> owned_weights(int layer) const;
  [[nodiscard]] CudaFfnLayerWeights split(const void* region) const;
  /// Grows `buffer` to rows x hidden F32 on the rank's GPU. Errors: out_of_memory.
  [[nodiscard]] Status ensure_rows(kernels::cuda::DeviceBuffer& buffer, int rows) const;
  [[nodiscard]] Status need_compute() const;

  std::shared_ptr<CudaLayerOwner> owner_;
  CudaFfnCompute* compute_ = nullptr;   ///< the bound runner's math
  std::chrono::milliseconds owner_wait_{30'000};  ///< how long an owned layer waits for its owner's load
  kernels::cuda::DeviceBuffer staging_;     // [total rows, hidden] CaS owner: own rows, then the peers'
  kernels::cuda::DeviceBuffer staged_out_;  // [total rows, hidden] its fused FFN output
  kernels::cuda::DeviceBuffer from_owner_;  // [rows, hidden] a CaS reply to this rank
};

}  // namespace shardline::model::sidp
