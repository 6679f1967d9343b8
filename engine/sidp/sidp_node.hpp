#pragma once
/// \file
/// A node's SiDP data-parallel group (seed 002 §4) whose ranks are separate
/// actors that come and go: one worker per device (it steps its own engine)
/// and one layer owner per device (it holds the FFN weights of the layers
/// its device owns). The devices are CPU devices (model::sidp::SidpFfn and
/// LayerOwner) or CUDA GPUs (model::sidp::CudaSidpFfn and CudaLayerOwner:
/// the owners' layers in their GPU's memory, the communicators
/// InProcDeviceCommunicator ranks, a GPU each or several ranks sharing one). engine/sidp/sidp_group.hpp is the same group driven
/// by one call (generate_sidp); this one is shared by the node's actors:
///
///  - The weights are loaded once, from the model files, and kept as the
///    host copy every rank's attention / embedding / lm_head weights and the
///    owners' FFN layers are packed from (a respawned owner repacks from it).
///  - Weights communicator: one in-process group for the node's lifetime.
///    Owner `r` exposes its FFN regions on rank r; rank r's WaS housekeeper
///    gets from the others through the same rank (so a restarted worker finds
///    the regions where they were, and the owners outlive the workers).
///  - Compute communicator (CaS p2p and the step control all-gather): a
///    *generation*. When a worker restarts, the rank it takes was already
///    taken in the current generation (by its dead predecessor), so the group
///    makes a new generation; the old one is marked dead, which fails every
///    peer still blocked in it at once. Live ranks move to the new generation
///    at their next step boundary (SidpRank::refresh); until every rank has,
///    CaS cannot run: a rank whose generation died runs WaS only.
///  - Mode directives (the orchestrator's broadcasts) are kept here too: a
///    rank that joins a generation starts it in WaS and is announced the
///    latest directive again, so the whole new generation applies it at one
///    step boundary through SidpFfn's protocol.
///
/// Thread-safe. The ranks' communicators are in-process (link emulation
/// applies to CPU devices, comm/paced.hpp); a group across processes is not
/// built here.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/inproc.hpp"
#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/sidp_ffn.hpp"

namespace shardline::model::sidp {
class CudaLayerOwner;  // model/cuda/sidp/cuda_layer_owner.hpp (CUDA builds)
}  // namespace shardline::model::sidp

namespace shardline::engine {

class SidpRank;

/// What a layer owner actor reports of its owner.
struct SidpOwnerState {
  std::vector<int> layers;        ///< the FFN layers it owns
  bool loaded = false;
  std::uint64_t weight_bytes = 0;  ///< its layers' bytes when loaded (device memory on a GPU)
  int loads = 0;                   ///< 1 + respawns
};

/// A directive of the orchestrator: run in `mode` from epoch `epoch` (>= 1).
struct SidpDirective {
  model::sidp::SidpMode mode = model::sidp::SidpMode::was;
  std::uint64_t epoch = 0;  ///< 0 = none yet
};

class SidpNodeGroup : public std::enable_shared_from_this<SidpNodeGroup> {
 public:
  /// Loads the model once (or uses base.weights), parses the ownership plan
  /// and makes the owners (not loaded: load_owner) and the weights group.
  /// On CUDA (base.device), rank r is on GPU sidp.rank_devices[r].
  /// sidp.tcp and sidp.initial_mode are not used (in-process; ranks start
  /// in WaS and follow the directives). Errors: invalid_argument (bad
  /// options or plan, a parallel config other than one device per rank;
  /// on CUDA: not one GPU per rank, link emulation), unsupported (CUDA in a
  /// build without it), what loading returns.
  [[nodiscard]] static Result<std::shared_ptr<SidpNodeGroup>> create(const EngineOptions& base,
                                                                     const SidpOptions& sidp);
  ~SidpNodeGroup();
  SidpNodeGroup(const SidpNodeGroup&) = delete;
  SidpNodeGroup& operator=(const SidpNodeGroup&) = delete;

  [[nodiscard]] int dp() const { return plan_.dp; }
  [[nodiscard]] const model::sidp::OwnershipPlan& plan() const { return plan_; }
  [[nodiscard]] const SidpOptions& options() const { return options_; }

  // ---- layer owners (the owner actors) ------------------------------------
  /// Owner `rank` packs its layers from the host copy and exposes them.
  /// No-op when loaded. Errors: invalid_argument (rank), what loading returns.
  [[nodiscard]] Status load_owner(int rank);
  /// Withdraws and frees owner `rank`'s layers (a killed owner); readers wait.
  void unload_owner(int rank);
  /// Owner `rank`'s layers, state and loads. Precondition: 0 <= rank < dp.
  [[nodiscard]] SidpOwnerState owner_state(int rank) const;
  /// Times owner `rank` was loaded (1 + respawns).
  [[nodiscard]] int owner_loads(int rank) const;
  /// Whether the ranks are CUDA GPUs.
  [[nodiscard]] bool cuda() const { return cuda_; }

  // ---- ranks (the worker actors) ------------------------------------------
  /// A worker incarnation takes rank `rank`: its SidpFfn (CudaSidpFfn on a
  /// GPU) over the rank's weights communicator, in no compute generation yet
  /// (SidpRank::join, once its engine is built), and the engine options for
  /// it (`base` with the shared weights and the FFN executor). Destroying
  /// the SidpRank marks its generation dead. Errors: invalid_argument
  /// (rank), what creating the rank's FFN returns.
  [[nodiscard]] Result<std::unique_ptr<SidpRank>> attach(int rank);

  /// Records a directive (the newest epoch wins) and returns the newest.
  SidpDirective record(const SidpDirective& directive);
  [[nodiscard]] SidpDirective directive() const;
  /// The current compute generation (1 after the first attach).
  [[nodiscard]] std::uint64_t generation() const;

 private:
  friend class SidpRank;
  /// One compute group over the dp ranks.
  struct Generation {
    std::uint64_t id = 0;
    SidpRankComms comms;       ///< in-process, paced with link emulation (device communicators on CUDA)
    std::vector<bool> taken;   ///< [dp]
    bool dead = false;
    [[nodiscard]] comm::Communicator* comm(int rank) const { return comms.at(rank); }
  };
  SidpNodeGroup() = default;
  /// dp in-process ranks: host ones, or device ones on the ranks' GPUs.
  [[nodiscard]] Result<SidpRankComms> make_comms() const;
  [[nodiscard]] Result<std::shared_ptr<Generation>> make_generation_locked();
  /// Takes `rank` in the current generation (a new one when it is taken).
  [[nodiscard]] Result<std::shared_ptr<Generation>> take_locked(int rank, bool new_if_taken);
  void kill_generation_locked(Generation& g);
  [[nodiscard]] bool dead(const Generation& g) const;

  SidpOptions options_;
  EngineOptions base_;
  std::shared_ptr<const model::ModelWeights> weights_;
  model::sidp::OwnershipPlan plan_;
  std::shared_ptr<comm::LinkModel> link_;  ///< shared by both groups' ranks (one emulated node)
  SidpRankComms weights_comms_;  ///< the node's lifetime: owners expose, housekeepers get
  bool cuda_ = false;
  std::vector<std::shared_ptr<model::sidp::LayerOwner>> owners_;          ///< [dp] CPU devices
  std::vector<std::shared_ptr<model::sidp::CudaLayerOwner>> cuda_owners_;  ///< [dp] CUDA GPUs
  std::vector<int> loads_;                                                 ///< [dp] owner loads so far

  mutable std::mutex mu_;
  std::shared_ptr<Generation> current_;
  std::uint64_t next_generation_ = 1;
  SidpDirective directive_;
};

/// One worker incarnation's place in a SidpNodeGroup. Used from the worker's
/// stepping thread, except directive() (any thread).
class SidpRank {
 public:
  ~SidpRank();
  SidpRank(const SidpRank&) = delete;
  SidpRank& operator=(const SidpRank&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  /// The rank's FFN (a SidpFfn on a CPU device, a CudaSidpFfn on a GPU).
  [[nodiscard]] model::sidp::SidpRankFfn& ffn() { return *ffn_; }
  /// The engine options of this rank: the group's base with the shared
  /// weights, this rank's FFN executor and its FFN share for the memory plan.
  [[nodiscard]] const EngineOptions& engine_options() const { return engine_options_; }
  /// Its compute generation (0 before join or while it has none).
  [[nodiscard]] std::uint64_t generation() const { return generation_ && !detached_ ? generation_->id : 0; }
  /// Whether this rank's compute generation was marked dead (a peer left);
  /// true before join.
  [[nodiscard]] bool generation_dead() const;

  /// Joins the current compute generation, or a new one when this rank is
  /// taken there or it is dead (a restarted worker), and announces the
  /// group's directive. Call once, when the engine is built (peers that
  /// follow wait for this rank in the first CaS collective). Errors: what
  /// making a generation or SidpFfn::rebind returns.
  [[nodiscard]] Status join();

  /// An orchestrator directive arrived: record it in the group and announce
  /// it to this rank's FFN (which applies it at a step boundary).
  void directive(const SidpDirective& d);

  /// At a step boundary: joins a newer compute generation when there is
  /// one with this rank free (then announces the group's directive again),
  /// or, when this rank's generation died and none is free yet, leaves CaS
  /// (WaS only until a generation is joined). Returns whether anything
  /// changed. Errors: what SidpFfn::rebind returns.
  [[nodiscard]] Result<bool> refresh();

 private:
  friend class SidpNodeGroup;
  SidpRank(std::shared_ptr<SidpNodeGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  std::shared_ptr<SidpNodeGroup> group_;
  int rank_;
  std::shared_ptr<SidpNodeGroup::Generation> generation_;
  bool detached_ = true;  ///< in no generation (before join, or after its generation died)
  std::shared_ptr<model::sidp::SidpRankFfn> ffn_;
  EngineOptions engine_options_;
};

}  // namespace shardline::engine
