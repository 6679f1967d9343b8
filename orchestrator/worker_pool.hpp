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
/// way.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/parallel_config.hpp"
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
  /// is presumed dead.
  double heartbeat_timeout_s = 30.0;
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
  };

  /// What a hello did.
  struct Hello {
    bool replaced = false;      ///< a worker of the same name was registered and is gone
    std::size_t requeued = 0;   ///< lines of the replaced instance made pending again
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

  /// Removes worker `name` and requeues its in-flight lines. Returns how
  /// many lines were requeued, or nothing when no such worker is registered.
  std::optional<std::size_t> remove(const std::string& name);

  /// Hands pending lines (JobManager::next_work) to every worker with queue
  /// room, in name order, until the jobs have nothing pending. Each worker's
  /// in_flight grows by what it got; the caller sends each Assignment.
  [[nodiscard]] std::vector<Assignment> dispatch();

  /// Commits the results a worker sent (JobManager::on_results) and counts
  /// them off its in_flight (never below 0); the worker was seen at `now`.
  /// Results of an unknown worker are committed all the same. Returns the
  /// lines newly committed; errors are JobManager::on_results'.
  Result<std::size_t> on_results(const std::string& name, const std::vector<worker::BatchResult>& results,
                                 Clock::time_point now);

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
};

}  // namespace shardline::orchestrator
