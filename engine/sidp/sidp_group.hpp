#pragma once
/// \file
/// A SiDP data-parallel group inside one process (seed 002): `dp` engines,
/// one per CPU device, each a whole-model replica with its own scheduler and
/// KV cache, whose FFN weights are shared: every layer's FFN lives on one
/// owner rank (model/sidp/ownership.hpp) and the other ranks run it through
/// model/sidp/sidp_ffn.hpp (WaS or CaS). The weights are loaded once and
/// shared by the ranks' runners; each rank's device memory holds the
/// attention weights of every layer, the FFN weights of its own layers and
/// its WaS cache slots.
///
/// Communicators: two in-process groups over the dp ranks, `weights` (the
/// owners expose their regions; the housekeepers get) and `compute` (CaS p2p
/// and the per-step control exchange).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/inproc.hpp"
#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/llm_engine.hpp"
#include "engine/policies/sidp_mode_policy.hpp"
#include "engine/sidp/sidp_process.hpp"
#include "engine/sidp/sidp_rank_loop.hpp"
#include "engine/group/tcp_group.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/sidp_ffn.hpp"

namespace shardline::engine {

/// `--weight-sharing sidp` settings.
struct SidpOptions {
  int dp = 2;                                  ///< ranks of the group (>= 2)
  std::string ownership = "balanced";          ///< "balanced" (layer l -> l mod dp) or "0,1,0,1"
  int cache_slots = 2;                         ///< WaS slots per rank (raised to what the order needs)
  bool peak_shifting = true;                   ///< §4.2 shifted prefetch order
  model::sidp::SidpMode initial_mode = model::sidp::SidpMode::was;
  std::chrono::milliseconds owner_wait{30'000};    ///< a rank waits this long for a down owner
  std::chrono::milliseconds comm_timeout{60'000};  ///< CaS p2p / control exchange timeout
  /// Link emulation (comm/paced.hpp): weight gets and CaS p2p sends are
  /// paced to this per-rank link, like NVLink between GPUs; gbps 0 = off
  /// (a get costs one memcpy on the shared memory bus).
  comm::LinkSpec link{};
  /// The ranks' communicators are TCP groups over 127.0.0.1 (comm/tcp.hpp)
  /// instead of in-process ones: weight reads and activations cross real
  /// sockets (the ranks still live in this process).
  bool tcp = false;
  /// The ranks are processes (engine/sidp/sidp_process.hpp): this process is
  /// rank 0 and joins the others at `processes->master`; ranks 1..dp-1 are
  /// `shardline shard serve --weight-sharing sidp` processes, which take
  /// the SiDP settings above (not `tcp`) from rank 0. Excludes `tcp`.
  std::optional<TcpGroupOptions> processes;
  /// CUDA ranks (SidpNodeGroup with base.device cuda): rank r's GPU; ranks
  /// may share one. Not for SidpGroup.
  std::vector<int> rank_devices;
};

/// ok, or the error of options a SiDP group cannot run with: invalid_argument
/// (a rank that is not one device, dp < 2, cache_slots < 1; CUDA: not a GPU
/// per rank, link emulation), unsupported (CUDA without `allow_cuda`, or in
/// a build without it). Shared by SidpGroup and SidpNodeGroup (which allows
/// CUDA).
[[nodiscard]] Status check_sidp_options(const EngineOptions& base, const SidpOptions& sidp, bool allow_cuda = false);

/// The communicators of a SiDP group's dp ranks over one group: each rank's
/// own (`inner`, given the comm timeout) and, with link emulation, its paced
/// wrapper (all ranks share one LinkModel: one emulated node); at(r) is the
/// one rank r uses.
struct SidpRankComms {
  std::shared_ptr<comm::InProcGroup> group;                 ///< null when `inner` came from elsewhere (TCP)
  std::vector<std::unique_ptr<comm::Communicator>> inner;   ///< [dp]
  std::vector<std::unique_ptr<comm::Communicator>> paced;   ///< [dp], empty without a link
  [[nodiscard]] comm::Communicator* at(int rank) const {
    const auto r = static_cast<std::size_t>(rank);
    return paced.empty() ? inner[r].get() : paced[r].get();
  }
  /// Over `inner` (rank r at index r), each given `timeout`, paced by `link`
  /// when not null. Errors: what PacedCommunicator::create returns.
  [[nodiscard]] static Result<SidpRankComms> wrap(std::vector<std::unique_ptr<comm::Communicator>> inner,
                                                  std::chrono::milliseconds timeout,
                                                  const std::shared_ptr<comm::LinkModel>& link);
  /// A new in-process group of dp ranks, then wrap. Errors: invalid_argument (dp < 1).
  [[nodiscard]] static Result<SidpRankComms> in_process(int dp, std::chrono::milliseconds timeout,
                                                        const std::shared_ptr<comm::LinkModel>& link);
};

class SidpGroup {
 public:
  /// Loads the model once (or uses base.weights), builds the ownership plan,
  /// the owners (loaded and exposed), the ranks' SidpFfn and one engine per
  /// rank from `base` (its parallel config must be single-device).
  /// Errors: invalid_argument (bad options or plan), whatever building an
  /// engine returns.
  [[nodiscard]] static Result<std::unique_ptr<SidpGroup>> create(const EngineOptions& base, const SidpOptions& sidp);
  ~SidpGroup();

  [[nodiscard]] int dp() const { return static_cast<int>(ranks_.size()); }
  /// Whether rank `rank` lives in this process (all of them, unless the
  /// group was made with SidpOptions::processes: then rank 0 only). The
  /// accessors below that return a rank's objects need a local rank.
  [[nodiscard]] bool local(int rank) const { return ranks_.at(static_cast<std::size_t>(rank)) != nullptr; }
  /// Rank `rank`'s SiDP counters (a remote rank's as of its last round).
  [[nodiscard]] model::sidp::SidpFfnStats ffn_stats(int rank);
  /// The remote ranks (null unless the group spans processes).
  [[nodiscard]] SidpRemoteRanks* remote() { return remote_.get(); }
  [[nodiscard]] const model::sidp::OwnershipPlan& plan() const { return plan_; }
  [[nodiscard]] LlmEngine& engine(int rank) { return *rank_at(rank).instance.engine; }
  [[nodiscard]] EngineInstance& instance(int rank) { return rank_at(rank).instance; }
  [[nodiscard]] model::sidp::SidpFfn& ffn(int rank) { return *rank_at(rank).ffn; }
  [[nodiscard]] model::sidp::LayerOwner& owner(int rank) { return *rank_at(rank).owner; }
  /// Rank `rank`'s CaS / control communicator (for its bytes_sent()).
  [[nodiscard]] comm::Communicator& compute_comm(int rank) { return *rank_at(rank).compute_comm; }
  /// Rank `rank`'s weights communicator (owners expose, housekeepers get).
  [[nodiscard]] comm::Communicator& weights_comm(int rank) { return *rank_at(rank).weights_comm; }

  /// The orchestrator's directive to every rank: run in `mode` from the next
  /// step boundary they agree on. Returns the epoch it was given.
  std::uint64_t announce(model::sidp::SidpMode mode);

  /// Kills rank `rank`'s layer owner: its FFN regions are withdrawn and
  /// freed; ranks needing them wait (up to owner_wait).
  void kill_owner(int rank);
  /// Respawns it: repacks its layers from the host copy of the model and
  /// exposes them again. Errors: what loading returns.
  [[nodiscard]] Status respawn_owner(int rank);

  /// Marks `rank` dead in the group's communicators: its peers' pending
  /// collectives, recvs and gets fail with io at once (a crashed rank).
  void mark_rank_dead(int rank);

  /// The emulated link (null without link emulation).
  [[nodiscard]] const comm::LinkModel* link() const { return link_.get(); }

  /// Bytes of weights rank `rank` holds: its runner's packed attention /
  /// embedding / lm_head weights plus its FFN share (owned layers + slots).
  [[nodiscard]] std::size_t weight_bytes(int rank);

  /// generate_sidp's body (below).
  [[nodiscard]] Result<std::vector<RequestOutput>> generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                                            const std::vector<sampling::SamplingParams>& params,
                                                            int threads_per_replica,
                                                            const std::function<void(int, int)>& observer);

 private:
  struct Rank {
    comm::Communicator* weights_comm = nullptr;  ///< what the rank uses (weights_.at(rank))
    comm::Communicator* compute_comm = nullptr;
    std::shared_ptr<model::sidp::LayerOwner> owner;
    std::shared_ptr<model::sidp::SidpFfn> ffn;
    EngineInstance instance;
  };
  SidpGroup() = default;
  [[nodiscard]] Rank& rank_at(int rank);

  model::sidp::OwnershipPlan plan_;
  std::shared_ptr<comm::LinkModel> link_;  ///< shared by both groups' ranks (one emulated node)
  SidpRankComms weights_;  ///< owners expose, housekeepers get
  SidpRankComms compute_;  ///< CaS p2p and the step control
  std::vector<std::unique_ptr<Rank>> ranks_;  ///< [dp]; null for a remote rank
  std::unique_ptr<SidpRemoteRanks> remote_;  ///< ranks 1..dp-1 when they are processes
  std::unique_ptr<SidpRound> round_;         ///< directive epochs and the current round's idle ranks
  std::uint64_t rounds_ = 0;                 ///< generate calls so far
};

/// Called after each real step of a rank with the sequences it ran (the
/// effective batch size the orchestrator's switch policy watches), and once
/// with 0 when the rank runs out of work. May call SidpGroup::announce.
/// Called on the rank's thread.
using SidpStepObserver = std::function<void(int rank, int num_seqs)>;

/// The orchestrator's part for an in-process group (§4.3 "consistent mode
/// switching"): feeds every rank's step reports to a SidpModePolicy and
/// broadcasts the switches it decides with SidpGroup::announce. Thread-safe
/// (ranks report from their own threads).
class SidpAutoSwitcher {
 public:
  struct Record {
    SidpMode to = SidpMode::cas;
    double at_s = 0;          ///< seconds since the switcher was made
    long long group_batch = 0;
    std::uint64_t epoch = 0;
  };
  SidpAutoSwitcher(SidpGroup& group, SidpModePolicy policy);
  /// The observer to pass to generate_sidp.
  [[nodiscard]] SidpStepObserver observer();
  [[nodiscard]] std::vector<Record> switches() const;

 private:
  void observe(int rank, int num_seqs);
  SidpGroup& group_;
  mutable std::mutex mu_;
  SidpModePolicy policy_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<Record> switches_;
};

/// Generates `prompts` over the group as generate_data_parallel does: prompt
/// i runs on rank i % dp as request id i, each rank steps on its own thread.
/// In WaS the ranks are independent; in CaS they step in lockstep and a rank
/// with no work runs dummy steps (which move no data) until no rank has
/// work. Errors: invalid_argument, the first rank error (a failed CaS step
/// fails every rank within the communicator timeout).
[[nodiscard]] Result<std::vector<RequestOutput>> generate_sidp(SidpGroup& group,
                                                               const std::vector<std::vector<std::int32_t>>& prompts,
                                                               const sampling::SamplingParams& params,
                                                               int threads_per_replica = 0,
                                                               const SidpStepObserver& observer = {});
/// The same with one SamplingParams per prompt (params.size() == prompts.size()).
[[nodiscard]] Result<std::vector<RequestOutput>> generate_sidp(SidpGroup& group,
                                                               const std::vector<std::vector<std::int32_t>>& prompts,
                                                               const std::vector<sampling::SamplingParams>& params,
                                                               int threads_per_replica = 0,
                                                               const SidpStepObserver& observer = {});

}  // namespace shardline::engine
