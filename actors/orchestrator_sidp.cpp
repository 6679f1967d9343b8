// The orchestrator's SiDP half (actors/orchestrator_sidp.hpp): the switcher
// of every SiDP group with its metrics, log lines and roster epoch, and the
// layer-owner registry.
#include "actors/orchestrator_sidp.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

namespace shardline::actors {

namespace {

using orchestrator::SidpDirective;

std::string group_label(const std::string& group) { return "group=\"" + group + "\""; }

}  // namespace

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

void describe_sidp_metrics(MetricsRegistry& m) {
  m.describe("shardline_layer_owner_restarts_total", "counter",
             "SiDP layer owners of this node respawned by its supervisor after a kill or crash, by owner.");
  m.describe("shardline_sidp_mode", "gauge",
             "The mode the orchestrator last told a SiDP group to run in, by group: 0 = WaS "
             "(Weight-as-a-Service), 1 = CaS (Compute-as-a-Service).");
  m.describe("shardline_sidp_switches_total", "counter",
             "WaS <-> CaS switches the orchestrator broadcast to a SiDP group, by group and target mode (to).");
}

// ---- workers of SiDP groups ----------------------------------------------------------

Status OrchestratorSidp::check(const messages::WorkerHello& hello) {
  if (!switcher_) {
    std::uint64_t epoch = 0;
    {
      std::lock_guard<std::mutex> lock(roster_->mu);
      epoch = roster_->sidp_epoch;
    }
    Result<orchestrator::SidpSwitcher> s = orchestrator::SidpSwitcher::create(policy_, epoch);
    if (!s) return s.error();
    switcher_.emplace(std::move(s).value());
    spdlog::info("orchestrator: SiDP mode switching {} (b* {}, h {}, dwell {} s); epochs continue above {}",
                 engine::to_string(policy_.setting), policy_.switch_batch, policy_.hysteresis, policy_.min_dwell_s,
                 epoch);
  }
  return switcher_->check_join(hello.sidp_group, static_cast<int>(hello.sidp_rank),
                               static_cast<int>(hello.sidp_ranks));
}

Result<OrchestratorSidp::Directives> OrchestratorSidp::joined(const messages::WorkerHello& hello,
                                                              Clock::time_point now) {
  if (Status ok = check(hello); !ok) return ok.error();
  auto d = switcher_->join(hello.sidp_group, static_cast<int>(hello.sidp_rank), static_cast<int>(hello.sidp_ranks),
                           hello.worker_name, now);
  if (!d) return std::move(d).error();
  Directives out;
  if (*d) {
    note(**d);
    out.push_back(std::move(**d));
  }
  return out;
}

OrchestratorSidp::Directives OrchestratorSidp::heartbeat(const std::string& name, long long num_running,
                                                         Clock::time_point now, long long num_waiting) {
  if (!switcher_) return {};
  switcher_->observe(name, num_running, now, num_waiting);
  return decide(now);
}

OrchestratorSidp::Directives OrchestratorSidp::decide(Clock::time_point now) {
  if (!switcher_) return {};
  const auto unix_ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  Directives out = switcher_->decide(now, unix_ms);
  for (const SidpDirective& d : out) note(d);
  return out;
}

void OrchestratorSidp::left(const std::string& name, Clock::time_point now) {
  if (switcher_) switcher_->leave(name, now);
}

void OrchestratorSidp::note(const SidpDirective& d) {
  {
    std::lock_guard<std::mutex> lock(roster_->mu);
    roster_->sidp_epoch = std::max(roster_->sidp_epoch, switcher_->last_epoch());
  }
  const char* mode = engine::to_string(d.mode);
  metrics_->set("shardline_sidp_mode", group_label(d.group), d.mode == engine::SidpMode::cas ? 1.0 : 0.0);
  switch (d.kind) {
    case SidpDirective::Kind::sync:
      // The counters exist (at 0) from the moment the group does.
      metrics_->add("shardline_sidp_switches_total", group_label(d.group) + ",to=\"was\"", 0);
      metrics_->add("shardline_sidp_switches_total", group_label(d.group) + ",to=\"cas\"", 0);
      spdlog::info("orchestrator: SiDP group {} is complete ({} ranks); they run in {} (epoch {})", d.group,
                   d.workers.size(), mode, d.epoch);
      break;
    case SidpDirective::Kind::rejoin:
      spdlog::info("orchestrator: SiDP group {}: {} joined again; it runs in {} (epoch {})", d.group,
                   d.workers.empty() ? "?" : d.workers.front(), mode, d.epoch);
      break;
    case SidpDirective::Kind::switch_:
      metrics_->add("shardline_sidp_switches_total", group_label(d.group) + ",to=\"" + mode + "\"", 1);
      spdlog::info("orchestrator: SiDP group {} switches to {} at group batch {} (epoch {}, {} workers)", d.group,
                   mode, d.group_batch, d.epoch, d.workers.size());
      break;
  }
}

messages::SidpSwitch OrchestratorSidp::to_message(const SidpDirective& d) {
  return messages::SidpSwitch{d.group, engine::to_string(d.mode), d.epoch};
}

std::vector<messages::SidpGroupStatus> OrchestratorSidp::groups() const {
  std::vector<messages::SidpGroupStatus> out;
  if (!switcher_) return out;
  for (const orchestrator::SidpGroupState& s : switcher_->status()) {
    messages::SidpGroupStatus g;
    g.group = s.group;
    g.mode = engine::to_string(s.mode);
    g.setting = engine::to_string(s.setting);
    g.num_ranks = static_cast<std::uint32_t>(s.num_ranks);
    g.switch_batch = static_cast<std::uint64_t>(std::max(0LL, s.switch_batch));
    g.group_batch = static_cast<std::uint64_t>(std::max(0LL, s.group_batch));
    for (const orchestrator::SidpSwitchRecord& r : s.switches)
      g.switches.push_back({engine::to_string(r.to), r.at_unix_ms,
                            static_cast<std::uint64_t>(std::max(0LL, r.group_batch)), r.epoch});
    g.num_switches = s.num_switches;
    out.push_back(std::move(g));
  }
  return out;
}

// ---- layer owners ---------------------------------------------------------------------

bool OrchestratorSidp::owner_seen(const caf::actor& sender, const messages::LayerOwnerHello& hello,
                                  Clock::time_point now) {
  if (!sender || dead_owners_.count(sender.address()) != 0) return false;
  const bool known = owners_.count(hello.owner_name) != 0;
  Owner& o = owners_[hello.owner_name];
  o.info = hello;
  o.last_seen = now;
  if (o.handle == sender) return false;
  if (known) {
    ++o.restarts;
    spdlog::warn("orchestrator: layer owner {} is a new instance (restarted; {} loads)", hello.owner_name,
                 hello.loads);
  } else {
    spdlog::info("orchestrator: layer owner {} joined (group {} rank {}, {} layers)", hello.owner_name, hello.group,
                 hello.rank, hello.layers.size());
  }
  o.handle = sender;
  return true;
}

bool OrchestratorSidp::owner_down(const caf::actor_addr& source) {
  for (auto& [name, o] : owners_) {
    if (o.handle && o.handle.address() == source) {
      spdlog::warn("orchestrator: layer owner {} is down", name);
      dead_owners_.insert(source);
      o.handle = caf::actor();
      return true;
    }
  }
  return false;
}

caf::actor OrchestratorSidp::owner(const std::string& name) const {
  const auto it = owners_.find(name);
  return it == owners_.end() ? caf::actor() : it->second.handle;
}

std::vector<messages::ActorInfo> OrchestratorSidp::list_owners(Clock::time_point now,
                                                              std::chrono::milliseconds silent_after) const {
  std::vector<messages::ActorInfo> out;
  for (const auto& [name, o] : owners_) {
    const messages::LayerOwnerHello& h = o.info;
    std::string layers;
    for (std::uint32_t l : h.layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
    std::string detail = "group " + h.group + " rank " + std::to_string(h.rank) + ", layers " +
                         (layers.empty() ? "-" : layers) + ", " + mib(h.weight_bytes) + ", " +
                         (h.loaded ? "loaded" : "not loaded");
    if (h.loads > 1) detail += " (" + std::to_string(h.loads) + " loads)";
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - o.last_seen);
    if (o.handle && silent > silent_after)
      detail += ", silent for " + std::to_string(silent.count() / 1000) + " s";
    out.push_back({name, "owner", h.node,
                   std::string(o.handle ? "running" : "down") + " restarts=" + std::to_string(o.restarts), "",
                   std::move(detail)});
  }
  return out;
}

}  // namespace shardline::actors
