#include "orchestrator/sidp_switcher.hpp"

#include <string>

namespace shardline::orchestrator {

namespace {

Error bad(const std::string& m) { return make_error(ErrorCode::invalid_argument, "sidp switcher: " + m); }

}  // namespace

Result<SidpSwitcher> SidpSwitcher::create(engine::SidpModePolicyOptions base, std::uint64_t last_epoch) {
  base.num_ranks = 1;  // each group's own comes with its hellos
  if (Status ok = base.validate(); !ok) return ok.error();
  return SidpSwitcher(base, last_epoch);
}

Status SidpSwitcher::check_join(const std::string& group, int rank, int num_ranks) const {
  if (group.empty()) return bad("a SiDP worker must name its group");
  if (num_ranks < 2) return bad("group " + group + " must have >= 2 ranks, got " + std::to_string(num_ranks));
  if (rank < 0 || rank >= num_ranks)
    return bad("rank " + std::to_string(rank) + " is outside group " + group + "'s ranks [0, " +
               std::to_string(num_ranks) + ")");
  if (const auto it = groups_.find(group); it != groups_.end()) {
    const int have = it->second.policy.options().num_ranks;
    if (have != num_ranks)
      return bad("group " + group + " has " + std::to_string(have) + " ranks, a worker says " +
                 std::to_string(num_ranks));
  }
  return Status::ok_status();
}

std::vector<std::string> SidpSwitcher::named(const Group& g) {
  std::vector<std::string> out;
  for (const std::string& w : g.workers)
    if (!w.empty()) out.push_back(w);
  return out;
}

Result<std::optional<SidpDirective>> SidpSwitcher::join(const std::string& group, int rank, int num_ranks,
                                                        const std::string& worker, TimePoint /*now*/) {
  if (Status ok = check_join(group, rank, num_ranks); !ok) return ok.error();
  if (worker.empty()) return bad("a SiDP worker must have a name");
  auto it = groups_.find(group);
  if (it == groups_.end()) {
    engine::SidpModePolicyOptions o = base_;
    o.num_ranks = num_ranks;
    Result<engine::SidpModePolicy> policy = engine::SidpModePolicy::create(o);
    if (!policy) return std::move(policy).error();
    Group g{std::move(policy).value(), std::vector<std::string>(static_cast<std::size_t>(num_ranks)), {}, 0, {}, 0};
    it = groups_.emplace(group, std::move(g)).first;
  }
  Group& g = it->second;

  // The name leaves whatever rank it held; the rank's previous worker loses it.
  if (const auto old = ranks_.find(worker); old != ranks_.end()) {
    groups_.at(old->second.first).workers[static_cast<std::size_t>(old->second.second)].clear();
    ranks_.erase(old);
  }
  std::string& slot = g.workers[static_cast<std::size_t>(rank)];
  if (!slot.empty()) ranks_.erase(slot);
  slot = worker;
  ranks_[worker] = {group, rank};

  if (g.broadcast) {
    SidpDirective d{group, *g.broadcast, g.broadcast_epoch, {worker}, SidpDirective::Kind::rejoin,
                    g.policy.group_batch()};
    return std::optional<SidpDirective>(std::move(d));
  }
  for (const std::string& w : g.workers)
    if (w.empty()) return std::optional<SidpDirective>();
  g.broadcast = g.policy.mode();
  g.broadcast_epoch = ++last_epoch_;
  SidpDirective d{group, *g.broadcast, g.broadcast_epoch, named(g), SidpDirective::Kind::sync, g.policy.group_batch()};
  return std::optional<SidpDirective>(std::move(d));
}

std::optional<std::pair<std::string, int>> SidpSwitcher::rank_of(const std::string& worker) const {
  const auto it = ranks_.find(worker);
  if (it == ranks_.end()) return std::nullopt;
  return it->second;
}

void SidpSwitcher::observe(const std::string& worker, long long num_running, TimePoint now, long long num_waiting) {
  const auto it = ranks_.find(worker);
  if (it == ranks_.end() || num_running < 0 || num_waiting < 0) return;
  // The rank is in range (join checked it) and the counts >= 0: cannot fail.
  (void)groups_.at(it->second.first).policy.observe(now, it->second.second, num_running, num_waiting);
}

void SidpSwitcher::leave(const std::string& worker, TimePoint now) {
  const auto it = ranks_.find(worker);
  if (it == ranks_.end()) return;
  Group& g = groups_.at(it->second.first);
  const int rank = it->second.second;
  (void)g.policy.observe(now, rank, 0);
  g.workers[static_cast<std::size_t>(rank)].clear();
  ranks_.erase(it);
}

std::vector<SidpDirective> SidpSwitcher::decide(TimePoint now, std::uint64_t unix_ms) {
  std::vector<SidpDirective> out;
  for (auto& [name, g] : groups_) {
    if (!g.broadcast) continue;  // not synced yet: its ranks do not agree on a mode
    const std::optional<engine::SidpSwitch> s = g.policy.decide(now);
    if (!s) continue;
    g.broadcast = s->to;
    g.broadcast_epoch = ++last_epoch_;
    g.switches.push_back(SidpSwitchRecord{s->to, unix_ms, s->group_batch, g.broadcast_epoch});
    while (g.switches.size() > kMaxListedSwitches) g.switches.pop_front();
    ++g.num_switches;
    out.push_back(SidpDirective{name, s->to, g.broadcast_epoch, named(g), SidpDirective::Kind::switch_,
                                s->group_batch});
  }
  return out;
}

std::vector<SidpGroupState> SidpSwitcher::status() const {
  std::vector<SidpGroupState> out;
  out.reserve(groups_.size());
  for (const auto& [name, g] : groups_) {
    SidpGroupState s;
    s.group = name;
    s.mode = g.broadcast.value_or(g.policy.mode());
    s.setting = g.policy.options().setting;
    s.num_ranks = g.policy.options().num_ranks;
    s.num_joined = static_cast<int>(named(g).size());
    s.synced = g.broadcast.has_value();
    s.switch_batch = g.policy.options().switch_batch;
    s.group_batch = g.policy.group_batch();
    s.switches.assign(g.switches.begin(), g.switches.end());
    s.num_switches = g.num_switches;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace shardline::orchestrator
