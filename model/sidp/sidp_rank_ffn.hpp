#pragma once
/// \file
/// What every SiDP data-parallel rank does whatever its device (seed 002
/// §4.3): the mode protocol and CaS's messages. model/sidp/sidp_ffn.hpp (CPU
/// ranks) and model/cuda/sidp/cuda_sidp_ffn.hpp (CUDA ranks) derive from it
/// and add where the rows and weights live and how the GEMMs run.
///
/// Consistent mode switching (§4.3): the orchestrator announces a mode with
/// an increasing epoch (announce(), from any thread); a rank applies it only
/// at a step boundary, in a collective every rank takes part in, so no layer
/// ever runs in mixed modes:
///  - WaS -> CaS: at its next step boundary (begin_control, or sync_mode
///    when it has nothing to run) a rank joins an all-gather of the
///    announcement; all ranks leave it in CaS, in lockstep from their next
///    step.
///  - CaS -> WaS: each step's control exchange (an all-gather of 4 floats per
///    rank: rows, announced epoch and mode) carries every rank's latest
///    announcement; the group takes the smallest epoch any rank has seen and,
///    if its mode is WaS, every rank switches in that same step.
/// The control exchange also tells every rank which peers are dummy this
/// step (no rows): dummy skipping. Two announcements must be further apart
/// than one step takes (the switch policy's minimum dwell guarantees it). A
/// rank that dies mid-switch or mid-CaS makes its peers' collective or recv
/// fail with io within the compute communicator's timeout; the group is then
/// broken (every later call fails at once) until rebind().
///
/// CaS messages for layer l (tags 2l and 2l + 1 on the compute
/// communicator): a rank with rows sends x [rows, hidden] F32 to the owner
/// and receives the FFN output [rows, hidden]; the owner receives every
/// non-dummy peer's rows in rank order, right after its own, runs one fused
/// GEMM chain over all of them and sends each peer its slice back.
///
/// Threads: sync_mode, dummy_step, rebind and the derived class's step calls
/// come from the rank's stepping thread; announce / mode / stats from any.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/weight_cache.hpp"

namespace shardline::model::sidp {

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

/// A rank's SiDP settings (every device).
struct SidpFfnOptions {
  WeightCacheOptions cache;          ///< WaS cache slots and owner wait
  bool peak_shifting = true;         ///< §4.2's per-rank shifted prefetch order
  SidpMode initial_mode = SidpMode::was;
};

class SidpRankFfn {
 public:
  virtual ~SidpRankFfn();
  SidpRankFfn(const SidpRankFfn&) = delete;
  SidpRankFfn& operator=(const SidpRankFfn&) = delete;

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
  /// nothing and returns it all the same. Errors: io, invalid_argument (in
  /// WaS), the derived class's serve errors.
  [[nodiscard]] Result<bool> dummy_step();

  /// At a step boundary, moves this rank to another compute group over the
  /// same dp ranks (`compute_comm`; a group rebuilt after a rank failed), or,
  /// with null, to none: the rank then runs WaS only (an announced CaS waits,
  /// join_pending() is false) until it is rebound. Either way it restarts in
  /// WaS with no announcement (epochs 0) and no longer broken; the caller
  /// announces the group's current directive again. The weights communicator
  /// and the cache stay. Errors: invalid_argument (the communicator is not
  /// this rank of dp, is the weights one, or not of the kind the derived
  /// class needs).
  [[nodiscard]] Status rebind(comm::Communicator* compute_comm);
  /// Whether the rank has a compute group (see rebind).
  [[nodiscard]] bool has_compute_group() const;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] const OwnershipPlan& plan() const { return plan_; }
  [[nodiscard]] SidpFfnStats stats() const;
  /// Slots of the WaS cache (0 when the rank owns every layer).
  [[nodiscard]] int cache_slots() const { return cache_ ? cache_->slots() : 0; }
  /// Bytes this rank holds for FFNs (in its device's memory): its owned
  /// layers plus its cache slots.
  [[nodiscard]] virtual std::size_t ffn_weight_bytes() const = 0;

 protected:
  /// `weights_comm` is where the owners' regions are read (never the
  /// compute group). No compute group until attach_compute.
  SidpRankFfn(const OwnershipPlan& plan, int rank, comm::Communicator* weights_comm, SidpMode initial_mode);
  /// The derived create()'s last step: the compute group (null: none, WaS
  /// only until rebind), keeping the initial mode. Errors: what control_of
  /// returns.
  [[nodiscard]] Status attach_compute(comm::Communicator* compute_comm);
  /// create()'s checks of the rank and both communicators. Errors: invalid_argument.
  [[nodiscard]] static Status check_rank(const OwnershipPlan& plan, int rank, comm::Communicator* weights_comm,
                                         comm::Communicator* compute_comm, SidpMode initial_mode);
  /// create()'s WaS cache over the weights communicator: the layers this
  /// rank does not own in `options`' prefetch order, paused when the rank
  /// starts in CaS (none when it owns every layer). `options.cache` says
  /// where the slots live; `region_bytes` [num_layers] each layer's region
  /// size. Errors: what WeightCache::create returns.
  [[nodiscard]] Status make_cache(std::vector<std::size_t> region_bytes, const SidpFfnOptions& options);
  /// Bytes of the cache's slots (0 without a cache).
  [[nodiscard]] std::size_t cache_bytes() const;

  // ---- what the derived class provides ------------------------------------
  /// Where the control all-gathers of `compute` run (host floats): `compute`
  /// itself unless it carries device buffers. Errors: invalid_argument.
  [[nodiscard]] virtual Result<comm::Communicator*> control_of(comm::Communicator* compute) { return compute; }
  /// CaS owner of `layer`: own rows x [num_rows, hidden] (null with 0 rows:
  /// a dummy step) and every non-dummy peer's through one fused GEMM chain;
  /// this rank's output goes where the derived class's forward wants it.
  [[nodiscard]] virtual Status serve(int layer, const float* x, int num_rows, float* out) = 0;

  // ---- for the derived class's step calls ---------------------------------
  /// Before a step's first layer: a pending WaS -> CaS join, then in CaS the
  /// control exchange of `num_rows`; counts the step. Errors: io (the
  /// collectives), the broken group's.
  [[nodiscard]] Status begin_control(int num_rows);
  /// A failed step: in CaS the group is broken; in WaS the cache's ring
  /// restarts (its slots dropped).
  void abort_control();
  void mark_broken();
  /// The CaS compute communicator (stepping thread; null without a group).
  [[nodiscard]] comm::Communicator* compute_comm() const { return compute_comm_; }
  /// Rows each rank has this CaS step ([dp], 0 = dummy).
  [[nodiscard]] const std::vector<int>& step_rows() const { return step_rows_; }
  /// Rows of the non-dummy peers this CaS step (the owner's staging beyond
  /// its own rows); counts the dummy peers skipped.
  [[nodiscard]] int peer_rows_to_serve();
  /// The owner's CaS receives: each non-dummy peer's rows of `layer`, in rank
  /// order, into staging[rows, hidden] (device or host, as the compute
  /// communicator's buffers). Errors: the communicator's.
  [[nodiscard]] Status recv_peer_rows(int layer, float* staging, int hidden);
  /// The owner's CaS replies: each non-dummy peer's slice of
  /// staged_out[rows, hidden] (the same order). Counts the fused GEMM of
  /// `total_rows`. Errors: the communicator's.
  [[nodiscard]] Status send_peer_rows(int layer, const float* staged_out, int hidden, int total_rows);
  /// A rank that does not own `layer`: x [num_rows, hidden] to the owner and
  /// its output back into out [num_rows, hidden]. Marks the group broken on
  /// failure. Errors: the communicator's.
  [[nodiscard]] Status exchange_with_owner(int layer, const float* x, int num_rows, int hidden, float* out);

  OwnershipPlan plan_;
  int rank_;
  comm::Communicator* weights_comm_;
  std::unique_ptr<WeightCache> cache_;  ///< WaS's ring; null when the rank owns every layer

 private:
  /// fn(peer, offset, elems) for each non-dummy peer in rank order, its
  /// slice [offset, offset + elems) of the owner's staging beyond its own rows.
  [[nodiscard]] Status each_peer_slice(int hidden, const std::function<Status(int, std::size_t, std::size_t)>& fn);
  [[nodiscard]] Status join_cas();                      // WaS -> CaS all-gather
  [[nodiscard]] Status control_exchange(int num_rows);  // CaS step start
  [[nodiscard]] Status broken_error() const;
  [[nodiscard]] bool broken() const;
  void enter_cas(std::uint64_t epoch);
  void enter_was(std::uint64_t epoch);

  comm::Communicator* compute_comm_ = nullptr;
  comm::Communicator* control_comm_ = nullptr;  ///< the compute group's host all-gathers

  std::atomic<SidpMode> mode_{SidpMode::was};
  mutable std::mutex mu_;  // announcement and stats
  SidpMode announced_mode_ = SidpMode::was;
  std::uint64_t announced_epoch_ = 0;
  std::uint64_t applied_epoch_ = 0;
  SidpFfnStats stats_;
  bool broken_ = false;  ///< a CaS step failed: the group must be rebuilt

  std::vector<int> step_rows_;  ///< [dp] rows of each rank this CaS step (0 = dummy)
  std::vector<float> control_;  // [dp, 4] the control all-gather
};

}  // namespace shardline::model::sidp
