#include "orchestrator/worker_pool.hpp"

#include <algorithm>
#include <utility>

#include "orchestrator/job_admission.hpp"

namespace shardline::orchestrator {

std::string node_of(const std::string& worker_name) { return worker_name.substr(0, worker_name.find('/')); }

WorkerPool::WorkerPool(JobManager& jobs, WorkerPoolOptions options) : jobs_(jobs), options_(std::move(options)) {}

Result<WorkerPool::Hello> WorkerPool::hello(const std::string& name, std::uint32_t max_batch,
                                            const engine::ParallelConfig& group, Clock::time_point now) {
  if (Status ok = check_worker_group(name, group, options_.parallel); !ok) return ok.error();
  Hello out;
  if (auto requeued = remove(name)) {
    out.replaced = true;
    out.requeued = *requeued;
  }
  Worker w;
  w.max_batch = std::max<std::uint32_t>(1, max_batch);
  w.parallel = group;
  w.last_seen = now;
  workers_[name] = std::move(w);
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
  for (auto& [name, w] : workers_) {
    const std::size_t capacity = queue_capacity(w.max_batch);
    if (w.in_flight >= capacity) continue;
    std::vector<worker::BatchRequest> work = jobs_.next_work(capacity - w.in_flight, name);
    if (work.empty()) break;  // nothing pending for anyone
    w.in_flight += work.size();
    out.push_back(Assignment{name, std::move(work)});
  }
  return out;
}

Result<std::size_t> WorkerPool::on_results(const std::string& name, const std::vector<worker::BatchResult>& results,
                                           Clock::time_point now) {
  if (const auto it = workers_.find(name); it != workers_.end()) {
    it->second.in_flight -= std::min(it->second.in_flight, results.size());
    it->second.last_seen = now;
  }
  return jobs_.on_results(results);
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
