#include "orchestrator/worker_pool.hpp"

#include <algorithm>
#include <utility>

#include "orchestrator/job_admission.hpp"

namespace shardline::orchestrator {

std::string node_of(const std::string& worker_name) { return worker_name.substr(0, worker_name.find('/')); }

WorkerPool::WorkerPool(JobManager& jobs, WorkerPoolOptions options) : jobs_(jobs), options_(std::move(options)) {}

Result<WorkerPool::Hello> WorkerPool::hello(const std::string& name, std::uint32_t max_batch,
                                            const engine::ParallelConfig& group, Clock::time_point now) {
  HelloInfo info;
  info.max_batch = max_batch;
  info.group = group;
  return hello(name, info, now);
}

Result<WorkerPool::Hello> WorkerPool::hello(const std::string& name, const HelloInfo& info, Clock::time_point now) {
  if (Status ok = check_worker_group(name, info.group, options_.parallel); !ok) return ok.error();
  Hello out;
  const auto it = workers_.find(name);
  if (it != workers_.end() && !info.instance.empty() && it->second.instance == info.instance) {
    out.again = true;
  } else if (auto requeued = remove(name)) {
    out.replaced = true;
    out.requeued = *requeued;
  }
  Worker& w = workers_[name];
  w.max_batch = std::max<std::uint32_t>(1, info.max_batch);
  w.parallel = info.group;
  w.instance = info.instance;
  w.last_seen = now;
  asked_.erase(name);
  if (!info.held.empty()) {
    auto claimed = jobs_.claim_in_flight(name, info.held);
    if (claimed.ok()) out.claimed = *claimed;
    else out.claim_error = claimed.error();
  }
  w.in_flight = jobs_.in_flight_count(name);
  if (awaited_.erase(name) != 0 && awaited_.empty() && !awaiting_unknown_) out.hold_ended = true;
  return out;
}

std::optional<std::size_t> WorkerPool::remove(const std::string& name) {
  const auto it = workers_.find(name);
  if (it == workers_.end()) return std::nullopt;
  const std::size_t n = jobs_.requeue_in_flight(name);
  workers_.erase(it);
  return n;
}

std::vector<Assignment> WorkerPool::dispatch() {
  std::vector<Assignment> out;
  if (holding()) return out;
  std::map<std::string, std::size_t> slot;  // worker -> its Assignment in `out`
  for (bool dealt = true; dealt;) {
    dealt = false;
    for (auto& [name, w] : workers_) {
      if (w.in_flight >= queue_capacity(w.max_batch)) continue;
      std::vector<worker::BatchRequest> work = jobs_.next_work(1, name);
      if (work.empty()) return out;  // nothing pending for anyone
      w.in_flight += work.size();
      dealt = true;
      const auto [it, fresh] = slot.emplace(name, out.size());
      if (fresh) out.push_back(Assignment{name, {}});
      for (auto& r : work) out[it->second].work.push_back(std::move(r));
    }
  }
  return out;
}

Result<std::size_t> WorkerPool::on_results(const std::string& name, const std::vector<worker::BatchResult>& results,
                                           Clock::time_point now) {
  auto committed = jobs_.on_results(results);
  if (const auto it = workers_.find(name); it != workers_.end()) {
    it->second.in_flight = jobs_.in_flight_count(name);
    it->second.last_seen = now;
  }
  return committed;
}

Result<std::vector<std::string>> WorkerPool::cancel_job(std::uint64_t job_id) {
  auto held = jobs_.cancel(job_id);
  for (auto& [name, w] : workers_) w.in_flight = jobs_.in_flight_count(name);
  return held;
}

void WorkerPool::await_workers(const std::vector<std::string>& names, Clock::time_point deadline) {
  awaited_.clear();
  for (const std::string& n : names)
    if (workers_.count(n) == 0) awaited_.insert(n);
  // One hold: with unknown workers awaited too, it lasts to the later deadline.
  hold_deadline_ = awaiting_unknown_ ? std::max(hold_deadline_, deadline) : deadline;
}

void WorkerPool::await_unknown_workers(Clock::time_point deadline) {
  awaiting_unknown_ = true;
  hold_deadline_ = std::max(hold_deadline_, deadline);
}

std::vector<std::string> WorkerPool::end_hold_if_due(Clock::time_point now) {
  if (!holding() || now < hold_deadline_) return {};
  std::vector<std::string> missing(awaited_.begin(), awaited_.end());
  awaited_.clear();
  awaiting_unknown_ = false;
  return missing;
}

bool WorkerPool::ask_hello(const std::string& name, Clock::time_point now) {
  if (workers_.count(name) != 0) return false;
  const auto it = asked_.find(name);
  if (it != asked_.end() && std::chrono::duration<double>(now - it->second).count() < options_.heartbeat_interval_s)
    return false;
  asked_[name] = now;
  return true;
}

void WorkerPool::excuse_silence(Clock::time_point now) {
  for (auto& [name, w] : workers_) w.last_seen = std::max(w.last_seen, now);
}

void WorkerPool::heartbeat(const std::string& name, std::optional<WorkerLoad> load, Clock::time_point now) {
  const auto it = workers_.find(name);
  if (it == workers_.end()) return;
  it->second.load = std::move(load);
  it->second.last_seen = now;
}

std::vector<std::string> WorkerPool::silent_workers(Clock::time_point now) const {
  std::vector<std::string> out;
  for (const auto& [name, w] : workers_)
    if (std::chrono::duration<double>(now - w.last_seen).count() > options_.heartbeat_timeout_s) out.push_back(name);
  return out;
}

std::size_t WorkerPool::room(const std::string& name) const {
  const Worker* w = find(name);
  if (w == nullptr) return 0;
  const std::size_t capacity = queue_capacity(w->max_batch);
  return w->in_flight >= capacity ? 0 : capacity - w->in_flight;
}

int WorkerPool::num_groups() const {
  int n = options_.parallel.dp;
  for (const auto& [name, w] : workers_)
    if (node_of(name) != options_.node_name) ++n;
  return n;
}

engine::ParallelConfig WorkerPool::cluster_config() const {
  engine::ParallelConfig pc = group_of(options_.parallel);
  pc.dp = num_groups();
  return pc;
}

const WorkerPool::Worker* WorkerPool::find(const std::string& name) const {
  const auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<WorkerInfo> WorkerPool::list() const {
  std::vector<WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [name, w] : workers_) {
    WorkerInfo info;
    info.name = name;
    info.node = node_of(name);
    if (!w.load) {
      info.state = "starting";
    } else {
      const WorkerLoad& l = *w.load;
      info.state = l.state + " running=" + std::to_string(l.num_running) + " waiting=" +
                   std::to_string(l.num_waiting) + " kv=" + std::to_string(l.kv_blocks_used) + "/" +
                   std::to_string(l.kv_blocks_total);
    }
    info.group = group_label(w.parallel);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace shardline::orchestrator
