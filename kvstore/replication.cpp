#include "kvstore/replication.hpp"

#include <algorithm>

namespace shardline::kvstore {
namespace {

/// The ring and self's position in it. Errors: invalid_argument.
Result<std::pair<std::vector<std::string>, std::size_t>> locate(std::span<const std::string> nodes,
                                                                const std::string& self) {
  std::vector<std::string> ring = ring_order(nodes);
  const auto it = std::lower_bound(ring.begin(), ring.end(), self);
  if (it == ring.end() || *it != self)
    return make_error(ErrorCode::invalid_argument, "replication: node '" + self + "' is not in the cluster");
  const auto at = static_cast<std::size_t>(it - ring.begin());
  return std::make_pair(std::move(ring), at);
}

/// The `count` nodes after (step +1) or before (step -1) self.
Result<std::vector<std::string>> neighbours(std::span<const std::string> nodes, const std::string& self,
                                            int replication_factor, int step) {
  if (replication_factor < 1)
    return make_error(ErrorCode::invalid_argument,
                      "replication: factor " + std::to_string(replication_factor) + " (must be >= 1)");
  auto located = locate(nodes, self);
  if (!located.ok()) return std::move(located).error();
  const auto& [ring, at] = *located;
  const std::size_t n = ring.size();
  const std::size_t count = std::min(static_cast<std::size_t>(replication_factor - 1), n - 1);
  std::vector<std::string> out;
  for (std::size_t i = 1; i <= count; ++i)
    out.push_back(ring[step > 0 ? (at + i) % n : (at + n - i) % n]);
  return out;
}

}  // namespace

std::vector<std::string> ring_order(std::span<const std::string> nodes) {
  std::vector<std::string> ring(nodes.begin(), nodes.end());
  std::sort(ring.begin(), ring.end());
  ring.erase(std::unique(ring.begin(), ring.end()), ring.end());
  return ring;
}

Result<std::optional<std::string>> ring_successor(std::span<const std::string> nodes, const std::string& self) {
  auto peers = neighbours(nodes, self, 2, +1);
  if (!peers.ok()) return std::move(peers).error();
  if (peers->empty()) return std::optional<std::string>();
  return std::optional<std::string>(peers->front());
}

Result<std::vector<std::string>> replica_peers(std::span<const std::string> nodes, const std::string& self,
                                               int replication_factor) {
  return neighbours(nodes, self, replication_factor, +1);
}

Result<std::vector<std::string>> replica_sources(std::span<const std::string> nodes, const std::string& self,
                                                 int replication_factor) {
  return neighbours(nodes, self, replication_factor, -1);
}

AckTracker::AckTracker(int replication_factor, std::vector<std::string> replicas)
    : factor_(std::max(1, replication_factor)) {
  set_replicas(std::move(replicas));
}

void AckTracker::set_replicas(std::vector<std::string> replicas) {
  if (replicas.size() > static_cast<std::size_t>(factor_ - 1)) replicas.resize(static_cast<std::size_t>(factor_ - 1));
  std::vector<bool> catching_up(replicas.size(), true);
  std::vector<int> old_slot(replicas.size(), -1);
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    old_slot[i] = slot(replicas[i]);
    if (old_slot[i] >= 0) catching_up[i] = catching_up_[static_cast<std::size_t>(old_slot[i])];
  }
  for (auto& [id, e] : requests_) {
    std::vector<int> moved(replicas.size(), 0);
    for (std::size_t i = 0; i < replicas.size(); ++i)
      if (old_slot[i] >= 0) moved[i] = e.replica[static_cast<std::size_t>(old_slot[i])];
    e.replica = std::move(moved);
    update(e);
  }
  replicas_ = std::move(replicas);
  catching_up_ = std::move(catching_up);
  for (std::size_t i = 0; i < replicas_.size(); ++i) refresh_catching_up(i);
}

void AckTracker::replica_replaced(const std::string& replica) {
  const int s = slot(replica);
  if (s < 0) return;
  for (auto& [id, e] : requests_) e.replica[static_cast<std::size_t>(s)] = 0;
  catching_up_[static_cast<std::size_t>(s)] = true;
  refresh_catching_up(static_cast<std::size_t>(s));
}

void AckTracker::on_local(std::uint64_t job_id, std::uint64_t request_id, int durable_tokens) {
  auto [it, inserted] = requests_.try_emplace({job_id, request_id});
  Entry& e = it->second;
  if (inserted) e.replica.assign(replicas_.size(), 0);
  e.local = std::max(e.local, durable_tokens);
  update(e);
}

Status AckTracker::on_replica(const std::string& replica, std::uint64_t job_id, std::uint64_t request_id,
                              int durable_tokens) {
  const int s = slot(replica);
  if (s < 0)
    return make_error(ErrorCode::invalid_argument, "replication: ack from '" + replica + "', not a current replica");
  auto [it, inserted] = requests_.try_emplace({job_id, request_id});
  Entry& e = it->second;
  if (inserted) e.replica.assign(replicas_.size(), 0);
  int& mine = e.replica[static_cast<std::size_t>(s)];
  mine = std::max(mine, durable_tokens);
  update(e);
  if (catching_up_[static_cast<std::size_t>(s)]) refresh_catching_up(static_cast<std::size_t>(s));
  return {};
}

void AckTracker::update(Entry& e) const {
  int m = e.local;
  for (const int r : e.replica) m = std::min(m, r);
  e.acked = std::max(e.acked, m);
}

int AckTracker::slot(const std::string& replica) const {
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (replicas_[i] == replica) return static_cast<int>(i);
  return -1;
}

void AckTracker::refresh_catching_up(std::size_t s) {
  for (const auto& [id, e] : requests_)
    if (e.replica[s] < e.local) return;
  catching_up_[s] = false;
}

int AckTracker::acked_tokens(std::uint64_t job_id, std::uint64_t request_id) const {
  const auto it = requests_.find({job_id, request_id});
  return it == requests_.end() ? 0 : it->second.acked;
}

int AckTracker::local_tokens(std::uint64_t job_id, std::uint64_t request_id) const {
  const auto it = requests_.find({job_id, request_id});
  return it == requests_.end() ? 0 : it->second.local;
}

int AckTracker::replica_tokens(const std::string& replica, std::uint64_t job_id, std::uint64_t request_id) const {
  const int s = slot(replica);
  const auto it = requests_.find({job_id, request_id});
  if (s < 0 || it == requests_.end()) return 0;
  return it->second.replica[static_cast<std::size_t>(s)];
}

std::vector<ReplicaLag> AckTracker::lag() const {
  std::vector<ReplicaLag> out(replicas_.size());
  for (std::size_t i = 0; i < replicas_.size(); ++i) {
    out[i].replica = replicas_[i];
    out[i].catching_up = catching_up_[i];
  }
  for (const auto& [id, e] : requests_) {
    for (std::size_t i = 0; i < replicas_.size(); ++i) {
      const int behind = e.local - e.replica[i];
      if (behind <= 0) continue;
      out[i].tokens_behind += static_cast<std::uint64_t>(behind);
      ++out[i].requests_behind;
      out[i].max_tokens_behind = std::max(out[i].max_tokens_behind, behind);
    }
  }
  return out;
}

void AckTracker::forget(std::uint64_t job_id, std::uint64_t request_id) {
  requests_.erase({job_id, request_id});
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (catching_up_[i]) refresh_catching_up(i);
}

void AckTracker::forget_job(std::uint64_t job_id) {
  requests_.erase(requests_.lower_bound({job_id, 0}),
                  job_id == UINT64_MAX ? requests_.end() : requests_.lower_bound({job_id + 1, 0}));
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (catching_up_[i]) refresh_catching_up(i);
}

}  // namespace shardline::kvstore
