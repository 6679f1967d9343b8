#pragma once
/// \file
/// Everything a worker does between messages, as one plain class: it owns
/// the BatchWorker (lines in, results out, over one engine), the KV streamer
/// and progress tracker (DéjàVu token streaming, seed 003 §4.1.1 (3)), the
/// resume fetches of failed lines' KV (§4.2.3), the SiDP stepper (seed 002
/// §4.2: WaS / CaS turns), the per-job token budget and the set of lines it
/// holds. The worker actor (actors/worker_actor.cpp) turns each message into
/// one call here and each outcome into messages and metrics; tests drive it
/// directly, with plain KV-store stand-ins (worker/kv_store_client.hpp).
///
/// Single-threaded: every method is called from the worker's thread. The
/// only other thread is the KV streamer's, which calls the progress
/// callback given to connect_kv_store().

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "engine/sidp/sidp_node.hpp"
#include "worker/batch_types.hpp"
#include "worker/batch_worker.hpp"
#include "worker/job_token_budget.hpp"
#include "worker/kv_progress.hpp"
#include "worker/kv_store_client.hpp"
#include "worker/kv_streamer.hpp"
#include "worker/sidp_stepper.hpp"
#include "worker/store_prefix_tier.hpp"

namespace shardline::worker {

struct WorkerRuntimeOptions {
  std::string name;               ///< the worker's name, in logs ("node0/cpu:0")
  engine::EngineOptions engine;   ///< its engine; with `sidp` the group's rank gives the options instead
  /// The node's SiDP group this worker is rank `sidp_rank` of (seed 002);
  /// null = no SiDP.
  std::shared_ptr<engine::SidpNodeGroup> sidp;
  int sidp_rank = 0;
  std::string sidp_group;         ///< "NODE/sidp": the directives it accepts name it
  std::uint64_t kv_queue_bytes = 64ull << 20;  ///< KvStreamerOptions::max_queued_bytes
  /// A step longer than half of this is logged, once: the orchestrator may
  /// take the silence for a hang (FailureDetection::failure_timeout_ms).
  int failure_timeout_ms = 3000;
  /// How long a resume fetch is asked again after errors (a store that was
  /// killed just before is back within a moment), and the pause between tries.
  std::chrono::milliseconds resume_fetch_window{5000};
  std::chrono::milliseconds resume_retry_interval{50};
  /// Called before each engine step with its 1-based number (a test hook:
  /// the worker actor stalls there); empty = none.
  std::function<void(std::uint64_t step)> before_step;
};

/// A resumed line's KV fetches, for the worker's metrics.
struct ResumeFetchReport {
  int num_fallbacks = 0;       ///< choices whose KV could not be fetched, or none of it was held (they recompute)
  double fetch_seconds = 0.0;  ///< wall time of the line's fetches
};

/// What step() did.
struct WorkerStepOutcome {
  bool stepped = false;              ///< an engine step ran
  std::vector<BatchResult> results;  ///< lines finished now (no longer held)
  /// When to step next: nullopt = when a message brings work or a
  /// directive; zero = at once; else after this delay (an idle SiDP rank's
  /// next lockstep turn).
  std::optional<std::chrono::milliseconds> next_step;
};

/// How much the worker's KV counters grew since the last take (to add to
/// monotonic metrics).
struct KvCounterGrowth {
  std::uint64_t computed_tokens = 0;
  std::uint64_t streamed_bytes = 0;
  std::uint64_t restored_tokens = 0;
  std::uint64_t recomputed_tokens = 0;  ///< resumed positions computed again (the failure's cost)
  std::uint64_t resume_fallbacks = 0;
  std::uint64_t prefix_query_tokens = 0;  ///< prefix caching: tokens looked up
  std::uint64_t prefix_hit_tokens = 0;    ///< of them, found cached (not computed)
  std::uint64_t prefix_tier_restored_tokens = 0;  ///< restored from the prefix tier (not computed)
  std::uint64_t prefix_tier_spilled_blocks = 0;   ///< evicted named blocks spilled to it
  std::uint64_t prefix_store_fetched_tokens = 0;  ///< prefix positions the node's KV store handed out
  std::uint64_t prefix_store_kept_blocks = 0;     ///< prefix blocks the node's KV store newly kept
};

class WorkerRuntime {
 public:
  /// Called on the KV streamer's thread after each flush the store
  /// acknowledged, with the choices' replicated progress (never empty).
  using KvProgressCallback = std::function<void(std::vector<KvProgress> progress)>;

  /// Builds the worker's engine (for a SiDP rank: attaches to the group
  /// and builds the rank's engine). The rank joins the group's compute
  /// generation in join_sidp(). Errors (the worker cannot start: a
  /// configuration problem, not worth a restart): what
  /// SidpNodeGroup::attach, build_engine and BatchWorker::create return.
  [[nodiscard]] static Result<std::unique_ptr<WorkerRuntime>> create(WorkerRuntimeOptions options);

  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;
  /// Logs what Seesaw's phases did, when the engine ran them.
  ~WorkerRuntime();

  /// A SiDP rank joins its group's compute generation (peers that follow
  /// into a new one wait for it there); no-op without SiDP. Errors: what
  /// SidpRank::join returns (a restart may succeed).
  [[nodiscard]] Status join_sidp();

  /// Connects the node's KV store. Resumed lines fetch their KV from
  /// `source`; cancelled jobs drop theirs there. When the engine can copy
  /// KV out, every running choice's new KV streams to `target` off the
  /// step loop and `on_progress` reports what the store acknowledged.
  /// Returns whether streaming started (false: the engine has no KV views,
  /// so a failed line resumes from its tokens only).
  [[nodiscard]] bool connect_kv_store(std::shared_ptr<ResumeKvSource> source, std::shared_ptr<AckedKvTarget> target,
                                      KvProgressCallback on_progress);

  /// Connects the persistent prefix tier (worker/store_prefix_tier.hpp):
  /// when the engine caches prefixes and can copy its KV out, its prefix
  /// tier becomes a StorePrefixTier over `store` (host memory of
  /// `host_bytes`, then the node's KV store) in place of the engine's own,
  /// and each new line's prompt blocks are staged from the store. Returns
  /// whether it is on.
  [[nodiscard]] bool connect_prefix_store(std::shared_ptr<PrefixBlockStore> store, std::uint64_t host_bytes);
  /// The persistent prefix tier's counters (nullopt when not connected).
  [[nodiscard]] std::optional<StorePrefixTierStats> prefix_store_stats() const;

  /// Waits until every streamed increment queued so far reached the store
  /// (true at once without streaming), and every prefix block queued for
  /// it; false on timeout.
  [[nodiscard]] bool drain_kv(std::chrono::milliseconds timeout);

  /// Takes a line: switches the engine to the line's job token budget,
  /// fetches a resumed line's KV (see ResumeFetchReport) and submits it to
  /// the BatchWorker (which answers bad lines with error results). Returns
  /// the fetch report of a line that resumes with one entry per choice,
  /// else nullopt.
  std::optional<ResumeFetchReport> accept(BatchRequest request);
  /// Drops a cancelled job: its requests, its held lines, its queued KV
  /// increments and progress, and its KV in the store.
  void cancel_job(std::uint64_t job_id);
  /// One turn of the step loop: an engine step when there is work (inside
  /// the SiDP stepper's before/after hooks), else an idle SiDP rank's turn.
  /// Finished lines leave the held set and their KV progress is forgotten.
  /// Errors: an engine or SiDP step failure: the worker is broken (its
  /// actor crashes, the orchestrator requeues its lines).
  [[nodiscard]] Result<WorkerStepOutcome> step();
  /// The orchestrator's SiDP directive. Errors: invalid_argument when this
  /// worker is not in SiDP group `group`, or `mode` is not "was" / "cas".
  [[nodiscard]] Status directive(const std::string& group, const std::string& mode, std::uint64_t epoch);

  [[nodiscard]] bool has_work() const { return worker_->has_work(); }
  /// Lines accepted and not yet answered (what a hello says it holds).
  [[nodiscard]] const std::set<LineRef>& held() const { return held_; }
  [[nodiscard]] WorkerStatusSnapshot status() const { return worker_->status(); }
  /// The counters' growth since the last call.
  [[nodiscard]] KvCounterGrowth take_kv_counter_growth();
  [[nodiscard]] std::uint64_t weight_bytes() const { return weight_bytes_; }
  /// "was" / "cas" for a SiDP rank, else null.
  [[nodiscard]] const char* sidp_mode_name() const { return sidp_ ? sidp_->mode_name() : nullptr; }
  /// Seesaw's phases when the engine runs them, else null.
  [[nodiscard]] const engine::SeesawPhases* seesaw() const { return engine::seesaw_phases_of(worker_->engine()); }
  [[nodiscard]] const BatchWorker& batch_worker() const { return *worker_; }

 private:
  explicit WorkerRuntime(WorkerRuntimeOptions options);
  void fetch_resume_kv(BatchRequest& request, ResumeFetchReport& report);
  /// Forgets queued increments and progress of `request_ids` of a job (all
  /// of the job's progress when empty).
  void forget_kv(std::uint64_t job_id, const std::vector<std::uint64_t>& request_ids);
  [[nodiscard]] Result<WorkerStepOutcome> engine_step();
  [[nodiscard]] Result<WorkerStepOutcome> idle_turn();

  WorkerRuntimeOptions options_;
  // Declared before the worker (destroyed after it): the streamer's
  // target and tracker are shared with its thread, and the SiDP rank
  // outlives the engine, which marks its compute generation dead.
  std::shared_ptr<AckedKvTarget> kv_target_;
  std::shared_ptr<KvProgressTracker> kv_progress_;
  std::shared_ptr<ResumeKvSource> resume_source_;
  std::unique_ptr<StorePrefixTier> prefix_store_tier_;  ///< outlives the engine (declared before the worker)
  std::unique_ptr<engine::SidpRank> joining_rank_;  ///< a SiDP rank until join_sidp()
  std::unique_ptr<SidpStepper> sidp_;
  std::uint64_t weight_bytes_ = 0;  ///< EngineInstance::weight_bytes
  std::unique_ptr<BatchWorker> worker_;
  std::unique_ptr<KvStreamer> kv_streamer_;  ///< destroyed first: its thread pushes nothing after
  std::unique_ptr<JobTokenBudget> token_budget_;
  std::set<LineRef> held_;
  KvCounterGrowth exported_;  ///< the counters' values at the last take
  std::uint64_t steps_ = 0;
  bool warned_slow_step_ = false;
  /// Link waits the streamer's thread reported, for the worker's thread
  /// (handle_link_waits), and the choices streamed again for one already.
  struct LinkWaits {
    std::mutex mu;
    std::vector<KvLinkWait> waits;
  };
  std::shared_ptr<LinkWaits> link_waits_ = std::make_shared<LinkWaits>();
  std::set<std::pair<std::uint64_t, std::uint64_t>> restreamed_;
  /// On the worker's thread, before a step: a choice whose link waits for a
  /// block that is not on its way to the store streams its head as KV.
  void handle_link_waits();
};

}  // namespace shardline::worker
