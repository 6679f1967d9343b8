#pragma once
/// \file
/// One DP rank's FFN under SiDP (seed 002 §4) on a CPU device: the
/// model::FfnExecutor the CPU runner calls for every decoder layer's FFN.
///
/// Layers this rank owns run on its LayerOwner's weights. The others run in
/// the group's current mode (the protocol: model/sidp/sidp_rank_ffn.hpp):
///  - WaS (§4.2): the layer's weights come through the WeightCache, whose
///    housekeeper prefetched them with one-sided gets; the GEMMs run here on
///    this rank's rows. Ranks are independent: no collective per step.
///  - CaS (§4.3): the rank sends its rows [rows, hidden] to the owner
///    (p2p) and receives the FFN output. The owner concatenates its own rows
///    and every non-dummy peer's rows in a staging buffer, runs ONE fused
///    GEMM chain over them (GEMM fusion), and returns each peer its slice.
///    Dummy skipping: a rank with no work (dummy_step) packs, sends and
///    computes nothing for layers it does not own, and owners neither wait
///    for nor compute dummy ranks.
/// The kernels are batch-invariant per row, so WaS, CaS and plain DP give
/// bit-identical outputs.
///
/// Threads: the FfnExecutor calls, sync_mode and dummy_step come from the
/// rank's stepping thread; announce / mode / stats from any thread.

#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "model/ffn_executor.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/sidp_rank_ffn.hpp"
#include "model/sidp/weight_cache.hpp"

namespace shardline::model::sidp {

class SidpFfn final : public FfnExecutor, public SidpRankFfn {
 public:
  /// `owner` is this rank's LayerOwner (loaded, or loaded later: its layers
  /// wait for it). `weights_comm` is the group the owners expose their
  /// regions on (used by this rank's housekeeper thread only);
  /// `compute_comm` is a second group over the same ranks for CaS p2p and
  /// the step control (used by the stepping thread only), or null: none yet
  /// (WaS only until rebind; initial_mode must then be WaS). Neither is owned.
  /// Errors: invalid_argument (mismatched plan / rank / communicators),
  /// out_of_memory.
  [[nodiscard]] static Result<std::shared_ptr<SidpFfn>> create(const OwnershipPlan& plan, int rank,
                                                               std::shared_ptr<LayerOwner> owner,
                                                               comm::Communicator* weights_comm,
                                                               comm::Communicator* compute_comm,
                                                               const SidpFfnOptions& options);
  ~SidpFfn() override;

  // ---- FfnExecutor ----------------------------------------------------------
  [[nodiscard]] Status begin_step(int num_rows) override;
  [[nodiscard]] Status forward(int layer, const float* x, int num_rows, float* out) override;
  void end_step() override {}
  void abort_step() override;

  [[nodiscard]] LayerOwner& owner() { return *owner_; }
  [[nodiscard]] std::size_t ffn_weight_bytes() const override;

 private:
  SidpFfn(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner, comm::Communicator* weights_comm,
          const SidpFfnOptions& options);
  [[nodiscard]] Status serve(int layer, const float* x, int num_rows, float* out) override;  // CaS owner

  std::shared_ptr<LayerOwner> owner_;
  SidpFfnOptions options_;
  int hidden_;        ///< the model's hidden size
  int intermediate_;  ///< the FFN's intermediate size

  std::vector<float> staging_;    // [total rows, hidden] CaS fused input
  std::vector<float> staged_out_; // [total rows, hidden]
  std::vector<float> gate_up_;    // [rows, 2 * intermediate] scratch
  std::vector<float> act_;        // [rows, intermediate] scratch
};

}  // namespace shardline::model::sidp
