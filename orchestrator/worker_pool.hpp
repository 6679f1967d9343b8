#pragma once
/// \file
/// The orchestrator's registry of workers as a plain class (no actors, no
/// clock of its own: every call that needs the time takes `now`). The
/// orchestrator actor owns one WorkerPool next to the JobManager it wraps,
/// keeps the actor handles itself (by worker name), and sends what the pool
/// decides.
///
/// A worker is registered by its hello (its engine-group shape must be the
/// cluster's, orchestrator::check_worker_group), gets up to 2 x max_batch
/// lines queued (dispatch), reports results (on_results) and heartbeats, and
/// leaves by remove() (it died, was killed, or missed its heartbeats: its
/// in-flight lines are requeued through JobManager::requeue_in_flight). A
/// second hello under a registered name replaces the first instance the same
/// way, unless it comes from the same instance (HelloInfo::instance): then
/// the worker keeps its lines.
///
/// After a restart of the orchestrator the pool starts empty while the
/// workers keep running: each says hello again with the lines it holds
/// (HelloInfo::held), which become in flight on it (JobManager::
/// claim_in_flight). Until the workers the previous incarnation knew have
/// done so, or a deadline passes, dispatch() hands out nothing
/// (await_workers), so that no held line is handed to a second worker.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/parallel_config.hpp"
#include "orchestrator/job_manager.hpp"
#include "worker/batch_types.hpp"

namespace shardline::orchestrator {

/// A worker's engine load from its last heartbeat.
struct WorkerLoad {
  std::string state;  ///< e.g. "idle", "busy"
  std::uint32_t num_running = 0;
  std::uint32_t num_waiting = 0;
  std::uint64_t kv_blocks_used = 0;
  std::uint64_t kv_blocks_total = 0;
  std::uint64_t weight_bytes = 0;  ///< weights its devices hold (for `actor list`)
  std::string sidp_mode;           ///< "was" / "cas" when it is a SiDP rank, else ""
  std::string seesaw_phase;        ///< "prefill" / "decode" when it runs Seesaw's phases, else ""
  std::uint64_t seesaw_transitions = 0;
  bool operator==(const WorkerLoad&) const = default;
};

struct WorkerPoolOptions {
  /// This node's name. Workers named "NODE/..." with another NODE belong to
  /// joined nodes and add one engine group each to the cluster.
  std::string node_name;
  /// This node's parallel config: the engine-group shape (tp, pp, sp) every
  /// worker of the cluster must have, and this node's number of groups (dp).
  engine::ParallelConfig parallel;
  /// Seconds a worker may stay silent (no heartbeat, no results) before it
  /// is presumed dead (`--failure-timeout-ms`).
  double heartbeat_timeout_s = 3.0;
  /// Seconds between a worker's heartbeats (`--heartbeat-ms`): an unknown
  /// worker is asked to say hello again at most once per interval
  /// (ask_hello).
  double heartbeat_interval_s = 1.0;
};

/// What a worker says in its hello.
struct HelloInfo {
  std::uint32_t max_batch = 1;     ///< 0 counts as 1
  engine::ParallelConfig group;    ///< its engine group (dp == 1)
  /// Lines it holds (a worker re-registering after an orchestrator restart):
  /// they become in flight on it.
  std::vector<worker::LineRef> held;
  /// Identifies the worker's instance (e.g. its actor): a hello from the
  /// instance already registered under the name re-registers it and keeps
  /// its in-flight lines; "" never matches.
  std::string instance;
};

/// Lines handed to one worker by dispatch().
struct Assignment {
  std::string worker;
  std::vector<worker::BatchRequest> work;
};

/// A registered worker as `actor list` shows it.
struct WorkerInfo {
  std::string name;
  std::string node;   ///< node_of(name)
  std::string state;  ///< "starting" before its first heartbeat, else "STATE running=R waiting=W kv=U/T"
  std::string group;  ///< group_label of its engine group, e.g. "tp=1,pp=1,sp=1"
};

/// The node of a worker name: "node1/cpu:0" -> "node1" (a name without '/'
/// is its own node).
[[nodiscard]] std::string node_of(const std::string& worker_name);

class WorkerPool {
 public:
  using Clock = std::chrono::steady_clock;

  /// One registered worker.
  struct Worker {
    std::uint32_t max_batch = 1;       ///< >= 1
    engine::ParallelConfig parallel;   ///< its engine group (as it said hello)
    std::size_t in_flight = 0;         ///< lines handed out and not yet returned
    std::optional<WorkerLoad> load;    ///< from its last heartbeat; none yet: "starting"
    Clock::time_point last_seen;       ///< hello, results or heartbeat
    std::string instance;              ///< HelloInfo::instance of its last hello
  };

  /// What a hello did.
  struct Hello {
    bool replaced = false;      ///< a worker of the same name was registered and is gone
    std::size_t requeued = 0;   ///< lines of the replaced instance made pending again
    bool again = false;         ///< the registered instance said hello again (nothing requeued)
    std::size_t claimed = 0;    ///< held lines now in flight on it
    std::optional<Error> claim_error;  ///< claiming failed (JobManager::claim_in_flight); it is registered anyway
    bool hold_ended = false;    ///< it was the last awaited worker (await_workers)
  };

  /// `jobs` must outlive the pool.
  WorkerPool(JobManager& jobs, WorkerPoolOptions options);

  /// Registers worker `name` with batch size `max_batch` (0 counts as 1) and
  /// engine group `group`, seen at `now`. A registered worker of the same
  /// name is replaced: its in-flight lines are requeued. Errors:
  /// invalid_argument (check_worker_group: its group shape is not the
  /// cluster's); then nothing changes.
  [[nodiscard]] Result<Hello> hello(const std::string& name, std::uint32_t max_batch,
                                    const engine::ParallelConfig& group, Clock::time_point now);
  /// As above with the lines the worker holds and its instance (HelloInfo):
  /// the held lines are claimed after any requeue, and the worker's
  /// in_flight is then what the JobManager has in flight on it.
  [[nodiscard]] Result<Hello> hello(const std::string& name, const HelloInfo& info, Clock::time_point now);

  /// Removes worker `name` and requeues its in-flight lines. Returns how
  /// many lines were requeued, or nothing when no such worker is registered.
  std::optional<std::size_t> remove(const std::string& name);

  /// Hands pending lines (JobManager::next_work) to the workers with queue
  /// room until every queue is full or the jobs have nothing pending. Lines
  /// are dealt one per worker per round, in name order, so a job smaller
  /// than the queues spreads evenly instead of filling the first workers'
  /// queues and leaving the others idle (what the simulator showed:
  /// docs/simulator.md). Each worker gets one Assignment, its lines in the
  /// order dealt; its in_flight grows by their number. Nothing while
  /// holding() (await_workers).
  [[nodiscard]] std::vector<Assignment> dispatch();

  /// After a restart of the orchestrator: holds dispatch() until every
  /// worker in `names` has said hello or `deadline` has passed
  /// (end_hold_if_due), so that lines those workers still hold are claimed
  /// by them before anything is handed out. Names already registered count
  /// as arrived; an empty set holds nothing. With await_unknown_workers
  /// too, it is one hold, to the later of the two deadlines.
  void await_workers(const std::vector<std::string>& names, Clock::time_point deadline);
  /// After a fresh start over unfinished work (the orchestrator's node
  /// restarted after a crash): the previous process's workers are unknown,
  /// and those of other nodes keep running and may hold lines this one has
  /// as pending (or have finished them, their results on the way). Holds
  /// dispatch() until `deadline`, whoever says hello, so that they claim
  /// those lines before anything is handed out a second time.
  void await_unknown_workers(Clock::time_point deadline);
  /// Ends the hold when its deadline has passed at `now`; returns the
  /// awaited workers that never said hello (then none is awaited).
  std::vector<std::string> end_hold_if_due(Clock::time_point now);
  [[nodiscard]] bool holding() const noexcept { return !awaited_.empty() || awaiting_unknown_; }

  /// True when a message from worker `name` finds it unregistered (an
  /// orchestrator restarted under it, or it was dropped while alive) and it
  /// has not been asked to say hello again within the last
  /// heartbeat_interval_s; the caller then asks it (HelloAgain).
  [[nodiscard]] bool ask_hello(const std::string& name, Clock::time_point now);

  /// The caller could not read its messages until `now` (it was blocked,
  /// e.g. by a long submit): every worker counts as seen at `now`, so that
  /// heartbeats still queued behind the stall are not taken for silence.
  void excuse_silence(Clock::time_point now);

  /// Commits the results a worker sent (JobManager::on_results); the worker
  /// was seen at `now` and its in_flight is then what the JobManager still
  /// has in flight on it (duplicates count off nothing). Results of an
  /// unknown worker are committed all the same. Returns the lines newly
  /// committed; errors are JobManager::on_results'.
  Result<std::size_t> on_results(const std::string& name, const std::vector<worker::BatchResult>& results,
                                 Clock::time_point now);

  /// Cancels a job (JobManager::cancel); each worker's in_flight is then
  /// what the JobManager still has in flight on it. Returns the workers that
  /// held lines of the job (the caller sends them CancelJob, so they drop
  /// its requests and KV). Errors are JobManager::cancel's.
  Result<std::vector<std::string>> cancel_job(std::uint64_t job_id);

  /// Records a heartbeat: the worker's load (none: it has none to report
  /// yet), seen at `now`. Unknown workers are ignored.
  void heartbeat(const std::string& name, std::optional<WorkerLoad> load, Clock::time_point now);

  /// Workers silent for more than heartbeat_timeout_s at `now`, in name
  /// order. They stay registered; the caller kills and remove()s them.
  [[nodiscard]] std::vector<std::string> silent_workers(Clock::time_point now) const;

  /// Lines a worker queues at most: 2 x max_batch.
  [[nodiscard]] static std::size_t queue_capacity(std::uint32_t max_batch) noexcept {
    return 2 * static_cast<std::size_t>(max_batch);
  }
  /// Lines worker `name` can take now (queue_capacity - in_flight; 0 when
  /// full or unknown).
  [[nodiscard]] std::size_t room(const std::string& name) const;

  /// Engine groups of the cluster: this node's dp (registered or not yet)
  /// plus one per registered worker of a joined node.
  [[nodiscard]] int num_groups() const;
  /// The parallel config a job runs on: the cluster's group shape with
  /// dp = num_groups().
  [[nodiscard]] engine::ParallelConfig cluster_config() const;

  [[nodiscard]] bool contains(const std::string& name) const { return workers_.count(name) != 0; }
  /// The registered worker `name`, or null.
  [[nodiscard]] const Worker* find(const std::string& name) const;
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }
  /// Every registered worker for `actor list`, in name order.
  [[nodiscard]] std::vector<WorkerInfo> list() const;
  [[nodiscard]] const WorkerPoolOptions& options() const noexcept { return options_; }

 private:
  JobManager& jobs_;
  WorkerPoolOptions options_;
  std::map<std::string, Worker> workers_;
  std::set<std::string> awaited_;              ///< await_workers: not yet said hello
  bool awaiting_unknown_ = false;              ///< await_unknown_workers: held until hold_deadline_
  Clock::time_point hold_deadline_;
  std::map<std::string, Clock::time_point> asked_;  ///< ask_hello: when each unknown worker was asked
};

}  // namespace shardline::orchestrator
