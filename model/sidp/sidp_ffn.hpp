#pragma once
/// \file
/// One DP rank's FFN under SiDP (seed 002 §4): the model::FfnExecutor the CPU
/// runner calls for every decoder layer's FFN.
///
/// Layers this rank owns run on its LayerOwner's weights. The others run in
/// the group's current mode:
///  - WaS (§4.2): the layer's weights come through the WeightCache, whose
///    housekeeper prefetched them with one-sided gets; the GEMMs run here on
///    this rank's rows. Ranks are independent: no collective per step.
///  - CaS (§4.3): the rank sends its rows [rows, hidden] to the owner
///    (p2p) and receives the FFN output. The owner concatenates its own rows
///    and every non-dummy peer's rows in a staging buffer, runs ONE fused
///    GEMM chain over them (GEMM fusion), and returns each peer its slice.
///    Ranks step in lockstep; each step starts with a control exchange (an
///    all-gather of 4 floats per rank: rows, announced epoch and mode) that
///    tells every rank which peers are dummy this step. Dummy skipping: a rank
///    with no work (dummy_step) packs, sends and computes nothing for layers
///    it does not own, and owners neither wait for nor compute dummy ranks.
/// The kernels are batch-invariant per row, so WaS, CaS and plain DP give
/// bit-identical outputs.
///
/// Consistent mode switching (§4.3): the orchestrator announces a mode with
/// an increasing epoch (announce(), from any thread); a rank applies it only
/// at a step boundary, in a collective every rank takes part in, so no layer
/// ever runs in mixed modes:
///  - WaS -> CaS: at its next step boundary (begin_step, or sync_mode when it
///    has nothing to run) a rank joins an all-gather of the announcement; all
///    ranks leave it in CaS, in lockstep from their next step.
///  - CaS -> WaS: each step's control exchange carries every rank's latest
///    announcement; the group takes the smallest epoch any rank has seen and,
///    if its mode is WaS, every rank switches in that same step.
/// Two announcements must be further apart than one step takes (the switch
/// policy's minimum dwell guarantees it). A rank that dies mid-switch or
/// mid-CaS makes its peers' collective or recv fail with io within the
/// compute communicator's timeout; the group is then broken (every later
/// call fails at once) and must be rebuilt, as after any worker failure.
///
/// Threads: the FfnExecutor calls, sync_mode and dummy_step come from the
/// rank's stepping thread; announce / mode / stats from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "model/ffn_executor.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/weight_cache.hpp"

namespace shardline::model::sidp {

struct SidpFfnOptions {
  WeightCacheOptions cache;          ///< WaS cache slots and owner wait
  bool peak_shifting = true;         ///< §4.2's per-rank shifted prefetch order
  SidpMode initial_mode = SidpMode::was;
};

/// Counters since creation.
struct SidpFfnStats {
  std::uint64_t was_steps = 0;
  std::uint64_t cas_steps = 0;          ///< CaS steps with rows on this rank
  std::uint64_t dummy_steps = 0;        ///< CaS steps with none (dummy_step)
  std::uint64_t cas_rows_sent = 0;      ///< rows sent to owners
  std::uint64_t cas_fused_gemms = 0;    ///< fused GEMM chains run as an owner
  std::uint64_t cas_fused_rows = 0;     ///< rows in them (own + peers')
  std::uint64_t cas_peer_skips = 0;     ///< (layer, dummy peer) pairs skipped as an owner
  std::uint64_t switches_to_cas = 0;
  std::uint64_t switches_to_was = 0;
  std::uint64_t applied_epoch = 0;
  WeightCacheStats cache;               ///< zeros when the rank owns every layer
};

class SidpFfn final : public FfnExecutor {
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

  // ---- mode control -------------------------------------------------------
  /// The orchestrator's directive: run in `mode` from the next step boundary
  /// every rank agrees on. Epochs must increase; older ones are ignored.
  void announce(SidpMode mode, std::uint64_t epoch);
  /// The mode steps run in now.
  [[nodiscard]] SidpMode mode() const { return mode_.load(); }
  /// True when an announced WaS -> CaS switch waits for this rank's next
  /// step boundary (call sync_mode when there is no step to run).
  [[nodiscard]] bool join_pending() const;
  /// At a step boundary with no step to run: applies a pending WaS -> CaS
  /// switch (joins the group's all-gather). Errors: io.
  [[nodiscard]] Status sync_mode();
  /// CaS with no rows on this rank: the step's control exchange, then serve
  /// the owned layers for the peers that have rows. Returns whether any rank
  /// had rows this step. If the exchange switches the group to WaS, serves
  /// nothing and returns it all the same. Errors: io, invalid_argument (in WaS).
  [[nodiscard]] Result<bool> dummy_step();

  /// At a step boundary, moves this rank to another compute group over the
  /// same dp ranks (`compute_comm`; a group rebuilt after a rank failed), or,
  /// with null, to none: the rank then runs WaS only (an announced CaS waits,
  /// join_pending() is false) until it is rebound. Either way it restarts in
  /// WaS with no announcement (epochs 0) and no longer broken; the caller
  /// announces the group's current directive again. The weights communicator
  /// and the cache stay. Errors: invalid_argument (the communicator is not
  /// this rank of dp, or is the weights one).
  [[nodiscard]] Status rebind(comm::Communicator* compute_comm);
  /// Whether the rank has a compute group (see rebind).
  [[nodiscard]] bool has_compute_group() const;

  // ---- FfnExecutor ----------------------------------------------------------
  [[nodiscard]] Status begin_step(int num_rows) override;
  [[nodiscard]] Status forward(int layer, const float* x, int num_rows, float* out) override;
  void end_step() override {}
  void abort_step() override;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] const OwnershipPlan& plan() const { return plan_; }
  [[nodiscard]] LayerOwner& owner() { return *owner_; }
  /// Slots of the WaS cache (0 when the rank owns every layer).
  [[nodiscard]] int cache_slots() const { return cache_ ? cache_->slots() : 0; }
  /// Bytes this rank holds for FFNs: its owned layers plus its cache slots.
  [[nodiscard]] std::size_t ffn_weight_bytes() const;
  [[nodiscard]] SidpFfnStats stats() const;

 private:
  SidpFfn(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner, comm::Communicator* weights_comm,
          comm::Communicator* compute_comm, const SidpFfnOptions& options);
  [[nodiscard]] Status join_cas();                 // WaS -> CaS all-gather
  [[nodiscard]] Status control_exchange(int num_rows);  // CaS step start
  [[nodiscard]] Status serve(int layer, const float* x, int num_rows, float* out);  // CaS owner
  [[nodiscard]] Status broken_error() const;
  void enter_cas(std::uint64_t epoch);
  void enter_was(std::uint64_t epoch);

  OwnershipPlan plan_;
  int rank_;
  std::shared_ptr<LayerOwner> owner_;
  comm::Communicator* weights_comm_;
  comm::Communicator* compute_comm_;
  SidpFfnOptions options_;
  FfnLayout layout_;
  std::unique_ptr<WeightCache> cache_;

  std::atomic<SidpMode> mode_{SidpMode::was};
  mutable std::mutex mu_;  // announcement and stats
  SidpMode announced_mode_ = SidpMode::was;
  std::uint64_t announced_epoch_ = 0;
  std::uint64_t applied_epoch_ = 0;
  SidpFfnStats stats_;
  bool broken_ = false;  ///< a CaS step failed: the group must be rebuilt

  std::vector<int> step_rows_;    ///< [dp] rows of each rank this CaS step (0 = dummy)
  std::vector<float> control_;    // [dp, 4] the control all-gather
  std::vector<float> staging_;    // [total rows, hidden] CaS fused input
  std::vector<float> staged_out_; // [total rows, hidden]
  std::vector<float> gate_up_;    // [rows, 2 * intermediate] scratch
  std::vector<float> act_;        // [rows, intermediate] scratch
};

}  // namespace shardline::model::sidp
